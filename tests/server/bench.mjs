// bench.mjs — aggregate decode tok/s and time to first token of kiln serve at several client
// counts (streaming /v1/completions, ignore_eos so every request makes max_tokens tokens).
// Driven by bench/bench_server.sh; prints a Markdown table.
import { startServer } from "./lib.mjs";

const model = process.env.BENCH_MODEL;
const levels = (process.env.BENCH_CLIENTS || "1,8,32").split(",").map(Number);
const maxTokens = Number(process.env.BENCH_TOKENS || 64);
const seconds = Number(process.env.BENCH_SECONDS || 20);
const extra = (process.env.BENCH_ARGS || "").split(" ").filter(Boolean);
const srv = await startServer(["--model", model, "--max-batch", String(Math.max(...levels)), ...extra]);
const prompt = "import os\nimport sys\n\n\ndef main(argv):\n    \"\"\"Parse the command line and run.\"\"\"\n";

async function one(i) {
  const t0 = performance.now();
  const r = await fetch(srv.url + "/v1/completions", { method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ prompt: prompt + "# request " + i + "\n", max_tokens: maxTokens, temperature: 0, ignore_eos: true, stream: true, stream_options: { include_usage: true } }) });
  const reader = r.body.getReader(), dec = new TextDecoder();
  let ttft = null, buf = "", tokens = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    if (ttft === null) { buf += dec.decode(value, { stream: true }); if (/"text":"[^"]/.test(buf)) ttft = performance.now() - t0; }
    const m = /"completion_tokens":(\d+)/.exec(dec.decode(value));
    if (m) tokens = Number(m[1]);
  }
  return { ttft: ttft ?? performance.now() - t0, tokens, ms: performance.now() - t0 };
}

const median = a => { const s = [...a].sort((x, y) => x - y); return s.length ? s[Math.floor(s.length / 2)] : NaN; };
const rows = [];
for (const n of levels) {
  await one(-1); // warm-up
  const t0 = performance.now();
  const res = [];
  let k = 0;
  await Promise.all(Array.from({ length: n }, async () => {
    while (performance.now() - t0 < seconds * 1000) res.push(await one(k++));
  }));
  const wall = (performance.now() - t0) / 1000;
  const toks = res.reduce((a, r) => a + r.tokens, 0);
  rows.push({ n, requests: res.length, tps: toks / wall, per: median(res.map(r => r.tokens / ((r.ms - r.ttft) / 1000))), ttft: median(res.map(r => r.ttft)) });
}
await srv.stop();
console.log(`| clients | requests | aggregate tok/s | per-client decode tok/s (median) | TTFT median (ms) |`);
console.log(`|---:|---:|---:|---:|---:|`);
for (const r of rows) console.log(`| ${r.n} | ${r.requests} | ${r.tps.toFixed(1)} | ${r.per.toFixed(1)} | ${r.ttft.toFixed(0)} |`);
