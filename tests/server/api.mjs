// api.mjs — kiln serve over plain HTTP: (1) a table of malformed requests, each with its expected
// status and error type in the right API shape; (2) chat/completions behaviour on the demo model
// (determinism, streaming == non-streaming, stop strings, logprobs, n, cached_tokens on a repeated
// conversation); (3) batching correctness on the qwen3 fixture (token-id prompts): greedy output
// equals transformers' reference, and N concurrent/staggered requests with shared prefixes return
// exactly what each returns alone.
import * as fs from "node:fs";
import { startServer, post, getJSON, sse, check, eq, finish, waitIdle, DEMO, SHARED } from "./lib.mjs";

const KEY = "sekret";
const auth = { authorization: "Bearer " + KEY };

// ---- (1) bad input table ------------------------------------------------------------------
let srv = await startServer(["--model", DEMO, "--api-key", KEY, "--ctx", "512", "--max-body", "65536", "--max-batch", "4"]);
const U = srv.url;
const chat = (extra) => JSON.stringify({ messages: [{ role: "user", content: "hi" }], max_tokens: 4, ...extra });
const anth = (extra) => JSON.stringify({ model: "x", max_tokens: 4, messages: [{ role: "user", content: "hi" }], ...extra });
const table = [
  // name, path, body, headers, status, error type, api
  ["no API key", "/v1/chat/completions", chat(), {}, 401, "authentication_error", "openai"],
  ["wrong API key (x-api-key)", "/v1/messages", anth(), { "x-api-key": "nope" }, 401, "authentication_error", "anthropic"],
  ["malformed JSON", "/v1/chat/completions", '{"messages": [', auth, 400, "invalid_request_error", "openai"],
  ["body is an array", "/v1/chat/completions", "[1,2]", auth, 400, "invalid_request_error", "openai"],
  ["messages missing", "/v1/chat/completions", '{"max_tokens":3}', auth, 400, "invalid_request_error", "openai"],
  ["messages empty", "/v1/chat/completions", chat({ messages: [] }), auth, 400, "invalid_request_error", "openai"],
  ["messages not an array", "/v1/chat/completions", chat({ messages: "hi" }), auth, 400, "invalid_request_error", "openai"],
  ["bad role", "/v1/chat/completions", chat({ messages: [{ role: "wizard", content: "x" }] }), auth, 400, "invalid_request_error", "openai"],
  ["content is a number", "/v1/chat/completions", chat({ messages: [{ role: "user", content: 5 }] }), auth, 400, "invalid_request_error", "openai"],
  ["image part", "/v1/chat/completions", chat({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }] }), auth, 400, "invalid_request_error", "openai"],
  ["temperature is a string", "/v1/chat/completions", chat({ temperature: "hot" }), auth, 400, "invalid_request_error", "openai"],
  ["max_tokens 0", "/v1/chat/completions", chat({ max_tokens: 0 }), auth, 400, "invalid_request_error", "openai"],
  ["max_tokens 1.5", "/v1/chat/completions", chat({ max_tokens: 1.5 }), auth, 400, "invalid_request_error", "openai"],
  ["top_p 2", "/v1/chat/completions", chat({ top_p: 2 }), auth, 400, "invalid_request_error", "openai"],
  ["n 100", "/v1/chat/completions", chat({ n: 100 }), auth, 400, "invalid_request_error", "openai"],
  ["stop is a number", "/v1/chat/completions", chat({ stop: 7 }), auth, 400, "invalid_request_error", "openai"],
  ["stream is a string", "/v1/chat/completions", chat({ stream: "yes" }), auth, 400, "invalid_request_error", "openai"],
  ["top_logprobs without logprobs", "/v1/chat/completions", chat({ top_logprobs: 2 }), auth, 400, "invalid_request_error", "openai"],
  ["tools not an array", "/v1/chat/completions", chat({ tools: {} }), auth, 400, "invalid_request_error", "openai"],
  ["prompt + max_tokens over ctx", "/v1/chat/completions", chat({ max_tokens: 600 }), auth, 400, "invalid_request_error", "openai"],
  ["body over --max-body", "/v1/chat/completions", chat({ pad: "x".repeat(70000) }), auth, 413, "invalid_request_error", "openai"],
  ["invalid UTF-8", "/v1/chat/completions", Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}]}')]), auth, 400, "invalid_request_error", "openai"],
  ["completions: prompt missing", "/v1/completions", '{"max_tokens":2}', auth, 400, "invalid_request_error", "openai"],
  ["completions: token id out of vocab", "/v1/completions", '{"prompt":[1,99999999],"max_tokens":2}', auth, 400, "invalid_request_error", "openai"],
  ["completions: prompt is an object", "/v1/completions", '{"prompt":{"a":1}}', auth, 400, "invalid_request_error", "openai"],
  ["completions: fractional token id", "/v1/completions", '{"prompt":[1.5]}', auth, 400, "invalid_request_error", "openai"],
  ["messages: max_tokens missing", "/v1/messages", JSON.stringify({ messages: [{ role: "user", content: "hi" }] }), auth, 400, "invalid_request_error", "anthropic"],
  ["messages: system role in messages", "/v1/messages", anth({ messages: [{ role: "system", content: "x" }] }), auth, 400, "invalid_request_error", "anthropic"],
  ["messages: image block", "/v1/messages", anth({ messages: [{ role: "user", content: [{ type: "image", source: {} }] }] }), auth, 400, "invalid_request_error", "anthropic"],
  ["messages: stop_sequences not strings", "/v1/messages", anth({ stop_sequences: [1] }), auth, 400, "invalid_request_error", "anthropic"],
  ["messages: malformed JSON", "/v1/messages", "{", auth, 400, "invalid_request_error", "anthropic"],
  ["messages: over ctx", "/v1/messages", anth({ max_tokens: 100000 }), auth, 400, "invalid_request_error", "anthropic"],
  ["unknown route", "/v1/nope", "{}", auth, 404, "not_found_error", "openai"],
];
for (const [name, path, body, headers, status, type, api] of table) {
  const r = await fetch(U + path, { method: "POST", headers: { "content-type": "application/json", ...headers }, body });
  const j = await r.json().catch(() => null);
  const gotType = api === "anthropic" ? j?.type === "error" && j?.error?.type : j?.error?.type;
  check(r.status === status && gotType === type && typeof j?.error?.message === "string" && j.error.message.length > 0,
    `bad input: ${name} -> ${status} ${type}`, { status: r.status, body: j });
}
{
  const r = await post(U + "/v1/chat/completions", chat({ max_tokens: 600 }), auth);
  check(/512/.test(r.json?.error?.message || ""), "context error names the limit (512)", r.json);
  const g = await fetch(U + "/v1/chat/completions", { headers: auth });
  eq(g.status, 405, "GET on a POST route -> 405");
  eq((await getJSON(U + "/v1/models/nope", auth)).status, 404, "unknown model id -> 404");
  const ok = await post(U + "/v1/chat/completions", chat({ some_unknown_field: { a: 1 }, user: "u" }), auth);
  eq(ok.status, 200, "unknown fields are ignored");
  eq((await getJSON(U + "/health")).json, { status: "ok" }, "healthy after the bad inputs");
}

// ---- (2) behaviour on the demo model ------------------------------------------------------
const conv = [{ role: "system", content: "You write Python." }, { role: "user", content: "def parse_args(argv):" }];
const greedy = { messages: conv, max_tokens: 24, temperature: 0 };
const a = await post(U + "/v1/chat/completions", greedy, auth);
const b = await post(U + "/v1/chat/completions", greedy, auth);
check(a.status === 200 && a.json.choices[0].message.content.length > 0, "chat: non-empty greedy reply", a.json);
eq(b.json.choices[0].message.content, a.json.choices[0].message.content, "chat: greedy is deterministic");
eq(b.json.usage.prompt_tokens_details.cached_tokens, a.json.usage.prompt_tokens - 1, "chat: repeated conversation reuses prompt_tokens-1 cached tokens");
check(a.json.usage.completion_tokens >= 1 && a.json.usage.total_tokens === a.json.usage.prompt_tokens + a.json.usage.completion_tokens, "chat: usage adds up", a.json.usage);
{ // multi-turn: the next turn reuses the whole previous prompt (and generated tokens)
  const next = [...conv, { role: "assistant", content: a.json.choices[0].message.content }, { role: "user", content: "more" }];
  const c = await post(U + "/v1/chat/completions", { messages: next, max_tokens: 4, temperature: 0 }, auth);
  check(c.json.usage.prompt_tokens_details.cached_tokens >= a.json.usage.prompt_tokens, "chat: next turn reuses at least the previous prompt", c.json.usage);
}
{ // streaming equals non-streaming, with a final usage chunk
  const s = await sse(U + "/v1/chat/completions", { ...greedy, stream: true, stream_options: { include_usage: true } }, { headers: auth });
  const chunks = s.events.filter(e => e.data !== "[DONE]").map(e => e.data);
  const text = chunks.map(c => c.choices?.[0]?.delta?.content || "").join("");
  eq(text, a.json.choices[0].message.content, "stream: concatenated deltas equal the non-streamed reply");
  eq(chunks[0].choices[0].delta.role, "assistant", "stream: first chunk carries the role");
  eq(s.events.at(-1).data, "[DONE]", "stream: ends with [DONE]");
  const usage = chunks.at(-1);
  check(usage.choices.length === 0 && usage.usage.completion_tokens === a.json.usage.completion_tokens, "stream: final usage chunk", usage);
  check(chunks.some(c => c.choices?.[0]?.finish_reason === a.json.choices[0].finish_reason), "stream: finish_reason chunk", chunks.at(-2));
}
{ // stop strings: cut the greedy text at a substring, both streaming and not
  const full = a.json.choices[0].message.content;
  const k = Math.max(2, Math.floor(full.length / 2));
  const stop = full.slice(k, k + 3);
  const want = full.slice(0, full.indexOf(stop));
  const r = await post(U + "/v1/chat/completions", { ...greedy, stop: [stop, "@@never@@"] }, auth);
  eq(r.json.choices[0].message.content, want, `stop: reply cut before ${JSON.stringify(stop)}`);
  eq(r.json.choices[0].finish_reason, "stop", "stop: finish_reason stop");
  const s = await sse(U + "/v1/chat/completions", { ...greedy, stop, stream: true }, { headers: auth });
  eq(s.events.filter(e => e.data !== "[DONE]").map(e => e.data.choices[0].delta.content || "").join(""), want, "stop: streamed reply cut the same way (hold-back)");
}
{ // logprobs
  const r = await post(U + "/v1/chat/completions", { ...greedy, max_tokens: 5, logprobs: true, top_logprobs: 3 }, auth);
  const lp = r.json.choices[0].logprobs?.content || [];
  eq(lp.length, r.json.usage.completion_tokens, "logprobs: one entry per completion token");
  check(lp.every(t => t.top_logprobs.length === 3 && t.logprob <= 0 && Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-4 &&
    t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob),
    "logprobs: greedy token is the top alternative, alternatives sorted", lp[0]);
}
{ // n choices, seeds, completions with text + token ids
  const r = await post(U + "/v1/chat/completions", { ...greedy, n: 3 }, auth);
  check(r.json.choices.length === 3 && r.json.choices.every(c => c.message.content === a.json.choices[0].message.content), "n=3 greedy: three identical choices", r.json.choices);
  const s1 = await post(U + "/v1/completions", { prompt: "import os\n", max_tokens: 12, temperature: 0.9, seed: 42 }, auth);
  const s2 = await post(U + "/v1/completions", { prompt: "import os\n", max_tokens: 12, temperature: 0.9, seed: 42 }, auth);
  eq(s2.json.choices[0].text, s1.json.choices[0].text, "completions: same seed, same sample");
  const t = await post(U + "/v1/completions", { prompt: "import os\n", max_tokens: 8, temperature: 0, return_token_ids: true, ignore_eos: true }, auth);
  check(t.json.choices[0].token_ids.length === 8 && t.json.prompt_token_ids.length === t.json.usage.prompt_tokens, "completions: return_token_ids", t.json);
  const ids = await post(U + "/v1/completions", { prompt: t.json.prompt_token_ids, max_tokens: 8, temperature: 0, return_token_ids: true, ignore_eos: true }, auth);
  eq(ids.json.choices[0].token_ids, t.json.choices[0].token_ids, "completions: token-id prompt == text prompt");
}
{
  const m = await fetch(U + "/metrics", { headers: auth }).then(r => r.text());
  check(/^kiln_requests_total \d+/m.test(m) && /^kiln_generated_tokens_total \d+/m.test(m), "metrics: Prometheus text", m.slice(0, 200));
  const st = await waitIdle(U, 10000, auth);
  check(st.requests.running === 0 && st.prefix_cache.cached_tokens > 0 && st.prefix_cache.hit_rate > 0, "stats: idle, cache hits counted", st);
}
const code = await srv.stop();
eq(code, 0, "demo server exits 0 on SIGTERM");

// ---- (3) batching correctness on the qwen3 fixture ---------------------------------------------
const fx = SHARED + "/fixtures/qwen3";
const ref = JSON.parse(fs.readFileSync(fx + "/reference.json", "utf8"));
srv = await startServer(["--model", fx, "--threads", "1", "--max-batch", "4", "--step-tokens", "16", "--ctx", "256"]);
const F = srv.url;
const gen = (prompt, n = 24) => post(F + "/v1/completions", { prompt, max_tokens: n, temperature: 0, ignore_eos: true, return_token_ids: true }).then(r => r.json);
const solo = await gen(ref.input_ids, ref.greedy_continuation.length);
eq(solo.choices?.[0]?.token_ids, ref.greedy_continuation, "fixture: greedy continuation equals transformers' reference");
const P = ref.input_ids;
const prompts = [
  P, P.slice(0, 5), [...P.slice(0, 5), 7, 8, 9], [...P, 11], [3, 4, 5, 6], [...P.slice(0, 3), 100, 200, 300, 400, 12, 13],
  [...P, ...P], [42], [...P.slice(0, 5), 7, 8, 10], Array.from({ length: 40 }, (_, i) => (i * 37) % 500),
];
const alone = [];
for (const p of prompts) alone.push((await gen(p, 20)).choices[0].token_ids);
// all at once (more than --max-batch, so some wait), then staggered joins while others decode
const together = await Promise.all(prompts.map(p => gen(p, 20)));
eq(together.map(r => r.choices[0].token_ids), alone, "fixture: 10 concurrent requests == each alone");
const staggered = await Promise.all(prompts.map((p, i) => new Promise(res => setTimeout(res, i * 30)).then(() => gen(p, 20))));
eq(staggered.map(r => r.choices[0].token_ids), alone, "fixture: staggered joins == each alone");
const again = await gen(prompts[6], 20);
check(again.usage.prompt_tokens_details.cached_tokens > 0, "fixture: repeated prompt reports cached_tokens", again.usage);
eq(again.choices[0].token_ids, alone[6], "fixture: output from a reused cache == fresh");
const st = await waitIdle(F);
eq([st.requests.running, st.requests.waiting], [0, 0], "fixture: scheduler idle afterwards");
await finish(srv);
