// bench_tokenizer.js — encode throughput of Hugging Face `tokenizers` (npm, Rust) on a text file.
// usage: node bench_tokenizer.js NPM_DIR MODEL_DIR FILE [REPEAT]; prints one JSON line.
'use strict';
const path = require('path');
const fs = require('fs');
const [npmDir, modelDir, file, repeatArg] = process.argv.slice(2);
const { Tokenizer } = require(path.join(npmDir, 'node_modules', 'tokenizers'));

(async () => {
  const text = fs.readFileSync(file, 'utf8');
  const bytes = Buffer.byteLength(text, 'utf8');
  const tok = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
  let best = Infinity, n = 0;
  for (let r = 0; r < parseInt(repeatArg || '3', 10); r++) {
    const t0 = process.hrtime.bigint();
    const enc = await tok.encode(text, null, { addSpecialTokens: false });
    n = enc.getIds().length; // materialize the ids, as kiln does
    const dt = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.min(best, dt);
  }
  console.log(JSON.stringify({ bytes, tokens: n, seconds: +best.toFixed(4), mb_per_s: +(bytes / best / 1e6).toFixed(2) }));
})().catch((e) => { console.error(e); process.exit(1); });
