#!/usr/bin/python3
"""make_random_model.py — a random-weight Qwen3 or Llama model in Hugging Face layout (config.json +
bf16 model.safetensors), for speed measurements at shapes whose weights do not fit in cache.

    /usr/bin/python3 bench/make_random_model.py --out DIR [--shape qwen3-0.6b|qwen3-8b|llama-3.2-1b|
        llama-3-8b] [--seed 1] [--tokenizer-from /work/shared/models/demo-bf16]

Only numpy (Debian's python3-numpy) is needed. Weights are N(0, 0.02) rounded to bf16, norms are
1 + N(0, 0.02); to write 8B-parameter shapes in seconds, each tensor is streamed as slices taken at
random offsets of one pool of 2^23 such values (the values do not matter for speed). The tokenizer files of --tokenizer-from are copied so loaders that want one find it;
its vocabulary is smaller than the model's, which is fine for benchmarks that feed random ids.
The output is not a useful model: it is for `kiln bench` / `llama-bench` only.
"""
import argparse
import json
import os
import shutil
import struct

import numpy as np

SHAPES = {
    # Qwen/Qwen3-0.6B's layout
    "qwen3-0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       vocab_size=151936, tie_word_embeddings=True, rope_theta=1000000.0,
                       max_position_embeddings=40960, rms_norm_eps=1e-6),
    # Qwen/Qwen3-8B's layout
    "qwen3-8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=12288,
                     vocab_size=151936, tie_word_embeddings=False, rope_theta=1000000.0,
                     max_position_embeddings=40960, rms_norm_eps=1e-6),
    # meta-llama/Llama-3.2-1B's layout (llama3 rope scaling left out: it does not change speed)
    "llama-3.2-1b": dict(arch="llama", hidden_size=2048, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                         intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                         rope_theta=500000.0, max_position_embeddings=131072, rms_norm_eps=1e-5),
    # meta-llama/Meta-Llama-3-8B's layout
    "llama-3-8b": dict(arch="llama", hidden_size=4096, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                       intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                       rope_theta=500000.0, max_position_embeddings=8192, rms_norm_eps=1e-5),
}


def tensors(c):
    h, hd, H, KV, I, V = (c["hidden_size"], c["head_dim"], c["num_attention_heads"],
                          c["num_key_value_heads"], c["intermediate_size"], c["vocab_size"])
    yield "model.embed_tokens.weight", (V, h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (H * hd, h)
        yield p + "self_attn.k_proj.weight", (KV * hd, h)
        yield p + "self_attn.v_proj.weight", (KV * hd, h)
        yield p + "self_attn.o_proj.weight", (h, H * hd)
        if c.get("arch", "qwen3") == "qwen3":
            yield p + "self_attn.q_norm.weight", (hd,)
            yield p + "self_attn.k_norm.weight", (hd,)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (I, h)
        yield p + "mlp.up_proj.weight", (I, h)
        yield p + "mlp.down_proj.weight", (h, I)
    yield "model.norm.weight", (h,)
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (V, h)


def bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return u.astype(np.uint16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", default="qwen3-0.6b", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tokenizer-from", default="/work/shared/models/demo-bf16")
    a = ap.parse_args()
    c = SHAPES[a.shape]
    os.makedirs(a.out, exist_ok=True)
    arch = c.get("arch", "qwen3")
    cfg = dict(architectures=["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
               model_type=arch, attention_bias=False, hidden_act="silu", torch_dtype="bfloat16",
               bos_token_id=0, eos_token_id=0, use_sliding_window=False,
               **{k: v for k, v in c.items() if k != "arch"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    specs = list(tensors(c))
    header, off = {}, 0
    for name, shape in specs:
        n = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(a.seed)
    pool_n, chunk = 1 << 23, 1 << 22
    pool = bf16(rng.standard_normal(pool_n, dtype=np.float32) * np.float32(0.02))
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape in specs:
            if len(shape) == 1:
                x = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
                bf16(x + np.float32(1.0)).tofile(f)
                continue
            left = int(np.prod(shape))
            while left:
                n = min(left, chunk)
                start = int(rng.integers(0, pool_n - n + 1))
                pool[start:start + n].tofile(f)
                left -= n
    if a.tokenizer_from:
        for fn in ("tokenizer.json", "tokenizer_config.json"):
            src = os.path.join(a.tokenizer_from, fn)
            if os.path.exists(src):
                shutil.copyfile(src, os.path.join(a.out, fn))
    print(f"wrote {a.out}: {off / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
