// load.mjs — 64 concurrent streaming clients on loopback for a bounded time: no errors, and every
// stream's token ids equal the request's solo greedy output (nothing lost or duplicated); then a
// soak where clients disconnect mid-stream, after which /stats shows no running, waiting or leaked
// sequences. Uses the qwen3 fixture (token-id prompts, return_token_ids) so it is fast on a CPU.
import * as fs from "node:fs";
import { startServer, post, getJSON, check, eq, finish, waitIdle, SHARED } from "./lib.mjs";

const CLIENTS = Number(process.env.KILN_LOAD_CLIENTS || 64);
const SECONDS = Number(process.env.KILN_LOAD_SECONDS || 20);
const MAXTOK = 16;
const fx = SHARED + "/fixtures/qwen3";
const ref = JSON.parse(fs.readFileSync(fx + "/reference.json", "utf8"));
const srv = await startServer(["--model", fx, "--threads", "1", "--max-batch", "32", "--ctx", "256", "--prefix-cache", "8"]);
const U = srv.url;
const prompts = Array.from({ length: 8 }, (_, i) => [...ref.input_ids.slice(0, 2 + i), ...Array.from({ length: i }, (_, k) => (k * 31 + i * 7) % 500)]);
const body = (p, stream, n = MAXTOK) => ({ prompt: p, max_tokens: n, temperature: 0, ignore_eos: true, return_token_ids: true, stream });
const alone = [];
for (const p of prompts) alone.push((await post(U + "/v1/completions", body(p, false))).json.choices[0].token_ids);
check(alone.every(a => a.length === MAXTOK), "solo references have max_tokens ids each");

async function streamIds(p, { abortAfter, maxTokens } = {}) {
  const ac = new AbortController();
  const r = await fetch(U + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body(p, true, maxTokens)), signal: ac.signal });
  if (r.status !== 200) return { error: "status " + r.status + " " + (await r.text()) };
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "", ids = [], done = false, finishReason = null, chunks = 0;
  try {
    for (;;) {
      const { value, done: end } = await reader.read();
      if (end) break;
      buf += dec.decode(value, { stream: true });
      let i;
      while ((i = buf.indexOf("\n\n")) >= 0) {
        const line = buf.slice(0, i); buf = buf.slice(i + 2);
        if (!line.startsWith("data: ")) continue;
        if (line === "data: [DONE]") { done = true; continue; }
        const j = JSON.parse(line.slice(6));
        if (j.error) return { error: j.error.message };
        const c = j.choices[0];
        if (c.token_ids) ids.push(...c.token_ids);
        if (c.finish_reason) finishReason = c.finish_reason;
        chunks++;
        if (abortAfter && chunks >= abortAfter) { ac.abort(); return { aborted: true, ids }; }
      }
    }
  } catch (e) { if (e.name === "AbortError") return { aborted: true, ids }; return { error: String(e) }; }
  return { ids, done, finishReason };
}

// ---- sustained load ----------------------------------------------------------------------------
const t0 = Date.now();
let completed = 0, errors = [], mismatches = [];
await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
  let k = c;
  while (Date.now() - t0 < SECONDS * 1000) {
    const pi = k++ % prompts.length;
    const r = await streamIds(prompts[pi]);
    if (r.error) { errors.push(r.error); continue; }
    if (!r.done || r.finishReason !== "length" || JSON.stringify(r.ids) !== JSON.stringify(alone[pi])) mismatches.push({ pi, r });
    completed++;
  }
}));
const secs = (Date.now() - t0) / 1000;
console.log(`load: ${CLIENTS} clients, ${completed} streams in ${secs.toFixed(1)} s, ${(completed * MAXTOK / secs).toFixed(0)} tok/s`);
check(completed >= CLIENTS, `load: at least one stream per client completed (${completed})`);
eq(errors.slice(0, 3), [], "load: no errors");
check(mismatches.length === 0, "load: every stream's ids == its solo output (no lost/duplicated tokens)", mismatches.slice(0, 2));

// ---- disconnect soak -----------------------------------------------------------------------------
const before = (await getJSON(U + "/stats")).json;
const results = await Promise.all(Array.from({ length: CLIENTS }, (_, c) => streamIds(prompts[c % prompts.length], { abortAfter: 2 + (c % 5), maxTokens: 220 })));
check(results.filter(r => r.aborted).length === CLIENTS, "soak: every client disconnected mid-stream", results.filter(r => !r.aborted).slice(0, 2));
const st = await waitIdle(U, 15000);
eq([st.requests.running, st.requests.waiting], [0, 0], "soak: nothing running or waiting afterwards");
check(st.kv.live_sequences <= 8 && st.prefix_cache.kept_sequences === st.kv.live_sequences, "soak: no leaked sequences (only the kept prefix cache)", st.kv);
check(st.requests.cancelled - before.requests.cancelled >= CLIENTS / 2, "soak: disconnects cancelled their requests", st.requests);
const after = await streamIds(prompts[0]);
eq(after.ids, alone[0], "server still correct after the soak");
await finish(srv);
