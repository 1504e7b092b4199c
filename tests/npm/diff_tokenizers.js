// diff_tokenizers.js — differential test of kiln's tokenizer against Hugging Face `tokenizers`
// (npm tokenizers@0.23.2, the Rust library behind a Node binding).
//
// usage: node diff_tokenizers.js NPM_DIR TEST_BIN MODEL_DIR [COUNT] [SEED] [LABEL]
// Generates COUNT strings (random code points across planes, code, whitespace runs,
// special-token fragments, mixed scripts, emoji/ZWJ sequences, digits, contractions) plus
// invalid UTF-8 byte strings, runs `TEST_BIN --batch MODEL_DIR` on them (hex lines in, JSON lines
// out) and requires, for valid UTF-8: identical ids (add_special_tokens false and true),
// identical offsets (getOffsets(): Unicode code point indices, the same unit as HF's Python API
// and kiln_tokenize_offsets; checked with and without special tokens), identical decode
// (skip_special_tokens false on ids, true on ids with specials), and the
// streaming decode equal to the full decode. For invalid UTF-8, kiln must refuse with
// "invalid argument" (HF's bindings cannot even be given such input).
'use strict';
const path = require('path');
const fs = require('fs');
const os = require('os');
const { execFileSync } = require('child_process');

const [npmDir, testBin, modelDir, countArg, seedArg, labelArg] = process.argv.slice(2);
const { Tokenizer } = require(path.join(npmDir, 'node_modules', 'tokenizers'));
const COUNT = parseInt(countArg || '3000', 10);
let seed = BigInt(parseInt(seedArg || '12345', 10));

function rnd() { // xorshift64*
  seed ^= seed >> 12n; seed ^= (seed << 25n) & 0xffffffffffffffffn; seed ^= seed >> 27n;
  return Number(((seed * 0x2545f4914f6cdd1dn) & 0xffffffffffffffffn) >> 11n) / 2 ** 53;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];

const RANGES = [
  [0x20, 0x7e], [0x20, 0x7e], [0x20, 0x7e], [0xa0, 0xff], [0x100, 0x24f], [0x370, 0x3ff],
  [0x400, 0x4ff], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f], [0xe00, 0xe7f],
  [0x300, 0x36f], [0x1100, 0x11ff], [0x2000, 0x206f], [0x2100, 0x27bf], [0x3000, 0x30ff],
  [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xe000, 0xf8ff], [0xfb00, 0xfb4f], [0xfe00, 0xfe0f],
  [0xff00, 0xffef], [0x10000, 0x1007f], [0x1d400, 0x1d7ff], [0x1f300, 0x1faff],
  [0x20000, 0x2a6df], [0xe0000, 0xe007f], [0xf0000, 0xf00ff], [0x0, 0x1f], [0x7f, 0x9f],
];
const WS = [' ', ' ', ' ', '\t', '\n', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u2028',
  '\u0085', '\u200b', '\u000b', '\u000c', '\u2009', '\u1680'];
const CODE = ['def ', 'return ', 'if (x) {', '}', '\n    ', 'int main(void)', '==', '!=', '->',
  '=>', '::', '#include <stdio.h>', 'self.', '__init__', '0x1F', '1e-9', '"str"', "'c'", '//',
  '/* */', '[i]', '(a, b)', 'for i in range(10):', '\t', '  ', 'λx.x', 'async fn', 'x += 1;'];
const SPECIAL = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<|im_', 'start|>', '<|',
  '|>', '<bos>', '<eos>', '<start_of_turn>', '<end_of_turn>', '<|begin_of_text|>',
  '<|eot_id|>', '<|start_header_id|>', '<unk>', '<pad>', '<0x41>', '<0xE6>', '</s>', '<s>',
  '<think>', '</think>', '<tool_call>', '<start_of_image>', '<mask>', '[multimodal]'];
const WORDS = ['hello', 'world', 'The', 'naïve', 'café', 'Ångström', 'straße', 'İstanbul',
  'ΣΊΣΥΦΟΣ', 'Привет', 'мир', '日本語', '漢字', '中文', '한국어', 'مرحبا', 'שלום', 'हिन्दी',
  'ไทย', 'ελληνικά', 'ﬁ', 'ＦＵＬＬ', '①②', '٣٤٥', '１２３', 'x²', '½', 'Ⅻ', 'ǅ'];
const EMOJI = ['😀', '🎉', '👍🏽', '👨\u200d👩\u200d👧\u200d👦', '🏳️\u200d🌈', '🇯🇵', '🇺🇸',
  '1️⃣', '❤️', '🧑🏿\u200d🚀', '🤷\u200d♀️', '\u200d', '\ufe0f', '🏴\u{e0067}\u{e0062}\u{e007f}'];
const CONTR = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "’s", "n't", "'"];

function randChar() {
  const [a, b] = pick(RANGES);
  let cp = a + ri(b - a + 1);
  if (cp >= 0xd800 && cp <= 0xdfff) cp = 0x41;
  return String.fromCodePoint(cp);
}

function piece(kind) {
  switch (kind) {
    case 0: return randChar();
    case 1: { let s = ''; for (let i = ri(6) + 1; i > 0; i--) s += pick(WS); return s; }
    case 2: return pick(CODE);
    case 3: return pick(SPECIAL);
    case 4: return pick(WORDS);
    case 5: return pick(EMOJI);
    case 6: return pick(CONTR);
    case 7: { let s = ''; for (let i = ri(25) + 1; i > 0; i--) s += String(ri(10)); return s; }
    case 8: return pick(SPECIAL).slice(0, 1 + ri(8));
    default: return ' ';
  }
}

function genText(style) {
  let s = '';
  const n = ri(style === 0 ? 40 : 14) + 1;
  for (let i = 0; i < n; i++) {
    const kind = style === 0 ? (rnd() < 0.7 ? 0 : ri(10)) : style === 1 ? pick([1, 2, 2, 4, 9, 7])
      : style === 2 ? pick([3, 8, 4, 9, 1]) : style === 3 ? pick([4, 5, 5, 0, 9, 6]) : ri(10);
    s += piece(kind);
  }
  return s;
}

function genInvalid() {
  const good = Buffer.from(genText(4), 'utf8');
  const bad = [[0xff], [0xc0, 0xaf], [0xe0, 0x80, 0xaf], [0xed, 0xa0, 0x80], [0xf4, 0x90, 0x80, 0x80],
    [0xe6, 0x97], [0x80], [0xf0, 0x9f, 0x98], [0xc3], [0xfe, 0xfe]];
  const at = ri(good.length + 1);
  return Buffer.concat([good.subarray(0, at), Buffer.from(pick(bad)), good.subarray(at)]);
}

async function main() {
  const hf = Tokenizer.fromFile(path.join(modelDir, 'tokenizer.json'));
  const inputs = [];
  for (let i = 0; i < COUNT; i++) inputs.push(Buffer.from(genText(i % 5), 'utf8'));
  const nInvalid = Math.max(50, Math.floor(COUNT / 20));
  for (let i = 0; i < nInvalid; i++) inputs.push(genInvalid());
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-tokdiff-'));
  const inFile = path.join(tmp, 'in.hex');
  fs.writeFileSync(inFile, inputs.map((b) => b.toString('hex')).join('\n') + '\n');
  const out = execFileSync(testBin, ['--batch', modelDir], {
    input: fs.readFileSync(inFile), maxBuffer: 1 << 30,
  }).toString('utf8').split('\n').filter((l) => l.length);
  fs.rmSync(tmp, { recursive: true, force: true });
  if (out.length !== inputs.length) throw new Error(`kiln answered ${out.length} of ${inputs.length} lines`);

  let ok = 0, okInvalid = 0, fail = 0;
  const same = (a, b) => a.length === b.length && a.every((v, i) => v === b[i]);
  for (let i = 0; i < inputs.length; i++) {
    const k = JSON.parse(out[i]);
    const bytes = inputs[i];
    const valid = Buffer.from(bytes.toString('utf8'), 'utf8').equals(bytes);
    if (!valid) {
      if (k.error === 'invalid argument') okInvalid++;
      else { fail++; if (fail <= 10) console.error(`invalid UTF-8 ${bytes.toString('hex')} was not refused`); }
      continue;
    }
    const text = bytes.toString('utf8');
    const e1 = await hf.encode(text, null, { addSpecialTokens: false });
    const e2 = await hf.encode(text, null, { addSpecialTokens: true });
    const ids = Array.from(e1.getIds()), idsSp = Array.from(e2.getIds());
    const hex = (t) => Buffer.from(t, 'utf8').toString('hex');
    const d1 = hex(await hf.decode(ids, false)), d2 = hex(await hf.decode(idsSp, true));
    const problems = [];
    if (k.error) problems.push(`kiln error ${k.error}: ${k.message}`);
    else {
      if (!same(k.ids, ids)) problems.push(`ids kiln ${JSON.stringify(k.ids)} hf ${JSON.stringify(ids)}`);
      if (!same(k.ids_special, idsSp)) problems.push(`ids_special kiln ${JSON.stringify(k.ids_special)} hf ${JSON.stringify(idsSp)}`);
      const o1 = JSON.stringify(e1.getOffsets()), o2 = JSON.stringify(e2.getOffsets());
      if (JSON.stringify(k.offsets) !== o1) problems.push(`offsets kiln ${JSON.stringify(k.offsets)} hf ${o1}`);
      if (JSON.stringify(k.offsets_special) !== o2) problems.push(`offsets_special kiln ${JSON.stringify(k.offsets_special)} hf ${o2}`);
      if (k.decoded !== d1) problems.push(`decode kiln ${JSON.stringify(k.decoded)} hf ${JSON.stringify(d1)}`);
      if (k.decoded_skip !== d2) problems.push(`decode(skip) kiln ${JSON.stringify(k.decoded_skip)} hf ${JSON.stringify(d2)}`);
      // the stream hands out NUL-terminated chunks and drops U+0000 (documented)
      if (k.stream !== d1) {
        const noNul = Buffer.from(d1, 'hex').toString('utf8').split('\0').join('');
        if (k.stream !== hex(noNul)) problems.push(`stream ${JSON.stringify(k.stream)} vs decode ${JSON.stringify(d1)}`);
      }
    }
    if (problems.length) {
      fail++;
      if (fail <= 10) console.error(`MISMATCH ${JSON.stringify(text)}\n  ${problems.join('\n  ')}`);
    } else ok++;
  }
  console.log(`${labelArg || modelDir}: ` +
    `${ok}/${COUNT} valid strings identical, ${okInvalid}/${nInvalid} invalid UTF-8 refused, ${fail} failures`);
  process.exit(fail ? 1 : 0);
}

main().catch((e) => { console.error(e); process.exit(2); });
