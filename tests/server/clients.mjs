// clients.mjs — the official `openai` and `@anthropic-ai/sdk` npm clients against kiln serve:
// non-streaming, streaming, stop sequences, tool definitions and tool-result turns, usage, and
// errors surfacing as the SDKs' typed exceptions.
import { startServer, check, eq, finish, npm, DEMO } from "./lib.mjs";

const OpenAI = npm("openai");
const AnthropicMod = npm("@anthropic-ai/sdk");
const Anthropic = AnthropicMod.default || AnthropicMod;

const KEY = "test-key";
const srv = await startServer(["--model", DEMO, "--api-key", KEY, "--ctx", "1024"]);
const openai = new OpenAI({ apiKey: KEY, baseURL: srv.url + "/v1", maxRetries: 0, timeout: 120000 });
const anthropic = new Anthropic({ apiKey: KEY, baseURL: srv.url, maxRetries: 0, timeout: 120000 });

const messages = [{ role: "system", content: "You write Python." }, { role: "user", content: "def read_config(path):" }];
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather for a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];

// ---- OpenAI ------------------------------------------------------------------------------
const models = await openai.models.list();
check(models.data.length === 1 && typeof models.data[0].id === "string", "openai: models.list", models.data);
const r1 = await openai.chat.completions.create({ model: "kiln", messages, max_tokens: 20, temperature: 0 });
check(r1.object === "chat.completion" && r1.choices[0].message.role === "assistant" && r1.choices[0].message.content.length > 0,
  "openai: chat completion", r1);
check(["stop", "length"].includes(r1.choices[0].finish_reason) && r1.usage.prompt_tokens > 0, "openai: finish_reason + usage", r1.usage);
const stream = await openai.chat.completions.create({ model: "kiln", messages, max_tokens: 20, temperature: 0, stream: true, stream_options: { include_usage: true } });
let text = "", usage = null, finishReason = null;
for await (const chunk of stream) {
  if (chunk.usage) usage = chunk.usage;
  const c = chunk.choices[0];
  if (c?.delta?.content) text += c.delta.content;
  if (c?.finish_reason) finishReason = c.finish_reason;
}
eq(text, r1.choices[0].message.content, "openai: streamed text equals non-streamed");
eq(finishReason, r1.choices[0].finish_reason, "openai: streamed finish_reason");
check(usage && usage.completion_tokens === r1.usage.completion_tokens && usage.prompt_tokens_details.cached_tokens > 0,
  "openai: streamed usage with cached_tokens", usage);
{ // stop sequence through the SDK
  const full = r1.choices[0].message.content;
  const k = Math.floor(full.length / 2), stop = full.slice(k, k + 2);
  const r = await openai.chat.completions.create({ model: "kiln", messages, max_tokens: 20, temperature: 0, stop: [stop] });
  eq(r.choices[0].message.content, full.slice(0, full.indexOf(stop)), "openai: stop sequence cuts the reply");
  eq(r.choices[0].finish_reason, "stop", "openai: stop -> finish_reason stop");
}
{ // tools: definitions, an earlier tool call and its result in the conversation
  const conv = [...messages, { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Paris\"}" } }] },
    { role: "tool", tool_call_id: "call_1", content: "sunny" }];
  const r = await openai.chat.completions.create({ model: "kiln", messages: conv, tools, tool_choice: "auto", max_tokens: 12, temperature: 0 });
  const m = r.choices[0].message;
  check(r.choices[0].finish_reason === "tool_calls" ? Array.isArray(m.tool_calls) && m.tool_calls.every(t => t.type === "function" && typeof t.function.arguments === "string")
    : typeof m.content === "string" && !m.tool_calls, "openai: tools request answered (tool_calls parsed or plain content)", r.choices[0]);
}
{ // errors -> typed exceptions
  try { await openai.chat.completions.create({ model: "kiln", messages: [], max_tokens: 3 }); check(false, "openai: empty messages rejected"); }
  catch (e) { check(e instanceof OpenAI.BadRequestError && e.status === 400 && e.error?.type === "invalid_request_error", "openai: 400 -> BadRequestError", e.message); }
  try { await new OpenAI({ apiKey: "wrong", baseURL: srv.url + "/v1", maxRetries: 0 }).models.list(); check(false, "openai: bad key rejected"); }
  catch (e) { check(e instanceof OpenAI.AuthenticationError && e.status === 401, "openai: 401 -> AuthenticationError", e.message); }
  try { await openai.chat.completions.create({ model: "kiln", messages, max_tokens: 5000 }); check(false, "openai: over-context rejected"); }
  catch (e) { check(e instanceof OpenAI.BadRequestError && /1024/.test(e.message), "openai: over-context -> 400 naming the limit", e.message); }
}
{
  const c = await openai.completions.create({ model: "kiln", prompt: "import sys\n", max_tokens: 10, temperature: 0 });
  check(c.object === "text_completion" && typeof c.choices[0].text === "string" && c.usage.completion_tokens >= 1, "openai: completions.create", c);
}

// ---- Anthropic ---------------------------------------------------------------------------
const amsgs = [{ role: "user", content: [{ type: "text", text: "def read_config(path):" }] }];
const a1 = await anthropic.messages.create({ model: "kiln", max_tokens: 20, temperature: 0, system: "You write Python.", messages: amsgs });
check(a1.type === "message" && a1.role === "assistant" && a1.content[0].type === "text" && a1.content[0].text.length > 0, "anthropic: message", a1);
check(["end_turn", "max_tokens"].includes(a1.stop_reason) && a1.usage.output_tokens > 0, "anthropic: stop_reason + usage", a1);
eq(a1.content[0].text, r1.choices[0].message.content, "anthropic: same greedy reply as OpenAI for the same conversation");
const as = anthropic.messages.stream({ model: "kiln", max_tokens: 20, temperature: 0, system: "You write Python.", messages: amsgs });
const types = [];
as.on("streamEvent", ev => types.push(ev.type));
const final = await as.finalMessage();
eq(final.content[0].text, a1.content[0].text, "anthropic: streamed text equals non-streamed");
check(types[0] === "message_start" && types.includes("content_block_start") && types.includes("content_block_delta") &&
  types.at(-3) === "content_block_stop" && types.at(-2) === "message_delta" && types.at(-1) === "message_stop", "anthropic: event grammar", types.join(","));
check(final.usage.cache_read_input_tokens > 0 && final.usage.output_tokens === a1.usage.output_tokens, "anthropic: streamed usage with cache reads", final.usage);
{
  const full = a1.content[0].text, k = Math.floor(full.length / 2), stop = full.slice(k, k + 2);
  const r = await anthropic.messages.create({ model: "kiln", max_tokens: 20, temperature: 0, system: "You write Python.", messages: amsgs, stop_sequences: [stop] });
  eq(r.content[0].text, full.slice(0, full.indexOf(stop)), "anthropic: stop_sequences cut the reply");
  eq([r.stop_reason, r.stop_sequence], ["stop_sequence", stop], "anthropic: stop_reason stop_sequence + which");
}
{
  const conv = [...amsgs, { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny" }] }];
  const r = await anthropic.messages.create({ model: "kiln", max_tokens: 12, temperature: 0, messages: conv,
    tools: [{ name: "get_weather", description: "Weather", input_schema: { type: "object", properties: { city: { type: "string" } } } }] });
  check(r.stop_reason === "tool_use" ? r.content.some(b => b.type === "tool_use" && typeof b.input === "object") : r.content[0].type === "text",
    "anthropic: tool_use/tool_result conversation answered", r);
}
try { await anthropic.messages.create({ model: "kiln", max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: { type: "base64", media_type: "image/png", data: "AA==" } }] }] }); check(false, "anthropic: image rejected"); }
catch (e) { check(e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === "invalid_request_error", "anthropic: 400 -> BadRequestError", e.message); }
try { await new Anthropic({ apiKey: "wrong", baseURL: srv.url, maxRetries: 0 }).messages.create({ model: "kiln", max_tokens: 5, messages: amsgs }); check(false, "anthropic: bad key rejected"); }
catch (e) { check(e instanceof Anthropic.AuthenticationError && e.status === 401, "anthropic: 401 -> AuthenticationError", e.message); }

await finish(srv);
