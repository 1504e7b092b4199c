#!/usr/bin/python3
"""make_family_model.py — random-weight models of the non-Llama families (Qwen3.5 hybrid DeltaNet,
Gemma 4 with per-layer inputs, Qwen3-MoE) at real layer shapes, in Hugging Face layout (config.json + bf16
model.safetensors), for `kiln bench`. The config starts from the family's test fixture
(/work/shared/fixtures/<family>/config.json, written by transformers) with the sizes replaced.

    /usr/bin/python3 bench/make_family_model.py --shape qwen3.5-0.8b|qwen3.5-4b|gemma-4-e4b| \
        qwen3-30b-a3b \
        --out DIR [--layers N] [--seed 1]

--layers N keeps the first N layers of the real pattern (every other size stays real), so a big
model fits a small machine; tok/s then scales with the layers kept. Weights are N(0, 0.02) in bf16
(drawn from one random pool at random offsets: enough for speed, far cheaper than fresh draws),
norms near their identity, DeltaNet A_log/dt_bias in their trained range. Not a useful model.

Shapes (from public configs; see docs/perf-families.md):
  qwen3.5-0.8b: hidden 1024, 24 layers (3 DeltaNet : 1 attention), 8 heads / 2 KV of 256,
                ffn 3584, DeltaNet 16 key / 16 value heads of 128, vocab 248320, tied
  qwen3.5-4b:   hidden 2560, 32 layers, 16 heads / 4 KV of 256, ffn 9216, DeltaNet 16 key /
                32 value heads of 128, vocab 248320, tied
  qwen3-30b-a3b: hidden 2048, 48 layers of attention + MoE, 32 heads / 4 KV of 128, 128
                experts of ffn 768, top 8 (renormalised), vocab 151936, untied; experts one
                tensor each (the HF layout)
  gemma-4-e4b:  hidden 2560, 42 layers (5 sliding : 1 full, window 512), 8 heads / 2 KV,
                head 256 (full layers 512), ffn 10240, per-layer inputs 256, last 18 layers
                KV-shared, vocab 262144, tied
"""
import argparse
import json
import os
import struct

import numpy as np

FIXTURES = os.environ.get("KILN_FIXTURES", "/work/shared/fixtures")  # the fixtures root (env: the GPU machine carries them elsewhere)

SHAPES = {
    "qwen3.5-0.8b": dict(family="qwen3_5_text", hidden_size=1024, num_hidden_layers=24,
                         num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                         intermediate_size=3584, linear_num_key_heads=16,
                         linear_num_value_heads=16, linear_key_head_dim=128,
                         linear_value_head_dim=128, vocab_size=248320, tie_word_embeddings=True),
    "qwen3.5-4b": dict(family="qwen3_5_text", hidden_size=2560, num_hidden_layers=32,
                       num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                       intermediate_size=9216, linear_num_key_heads=16, linear_num_value_heads=32,
                       linear_key_head_dim=128, linear_value_head_dim=128, vocab_size=248320,
                       tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(family="qwen3_moe", hidden_size=2048, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                          intermediate_size=6144, moe_intermediate_size=768,
                          num_local_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                          vocab_size=151936, tie_word_embeddings=False),
    "gemma-4-e4b": dict(family="gemma4_text", hidden_size=2560, num_hidden_layers=42,
                        num_attention_heads=8, num_key_value_heads=2, head_dim=256,
                        global_head_dim=512, intermediate_size=10240,
                        hidden_size_per_layer_input=256, num_kv_shared_layers=18,
                        sliding_window=512, vocab_size=262144, vocab_size_per_layer_input=262144,
                        tie_word_embeddings=True),
}


def qwen35_config(base, s, n_layers):
    c = dict(base)
    c.update({k: v for k, v in s.items() if k != "family"})
    c["num_hidden_layers"] = n_layers
    c["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                        for i in range(n_layers)]
    c["full_attention_interval"] = 4
    c["max_position_embeddings"] = 262144
    return c


def gemma4_config(base, s, n_layers_real, n_layers):
    c = dict(base)
    c.update({k: v for k, v in s.items() if k != "family"})
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
             for i in range(n_layers_real)]
    # the shared tail is part of the real pattern: keep its share when layers are cut
    shared = s["num_kv_shared_layers"] * n_layers // n_layers_real
    # a shared layer reads the last earlier non-shared layer of its type: keep that possible
    while shared and not all(t in types[:n_layers - shared]
                             for t in types[n_layers - shared:n_layers]):
        shared -= 1
    c.update(num_hidden_layers=n_layers, layer_types=types[:n_layers], num_kv_shared_layers=shared,
             max_position_embeddings=131072)
    return c


def qwen35_tensors(c):
    h, V = c["hidden_size"], c["vocab_size"]
    H, KV, hd, I = (c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                    c["intermediate_size"])
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"],
                      c["linear_key_head_dim"], c["linear_value_head_dim"])
    K = c.get("linear_conv_kernel_dim", 4)
    conv = 2 * nk * dk + nv * dv
    yield "model.embed_tokens.weight", (V, h), "w"
    for i, t in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), "n0"
        yield p + "post_attention_layernorm.weight", (h,), "n0"
        if t == "linear_attention":
            a = p + "linear_attn."
            yield a + "in_proj_qkv.weight", (conv, h), "w"
            yield a + "in_proj_z.weight", (nv * dv, h), "w"
            yield a + "in_proj_a.weight", (nv, h), "w"
            yield a + "in_proj_b.weight", (nv, h), "w"
            yield a + "conv1d.weight", (conv, 1, K), "conv"
            yield a + "A_log", (nv,), "alog"
            yield a + "dt_bias", (nv,), "dt"
            yield a + "norm.weight", (dv,), "n1"
            yield a + "out_proj.weight", (h, nv * dv), "w"
        else:
            a = p + "self_attn."
            yield a + "q_proj.weight", (2 * H * hd, h), "w"  # query | output gate
            yield a + "k_proj.weight", (KV * hd, h), "w"
            yield a + "v_proj.weight", (KV * hd, h), "w"
            yield a + "o_proj.weight", (h, H * hd), "w"
            yield a + "q_norm.weight", (hd,), "n0"
            yield a + "k_norm.weight", (hd,), "n0"
        yield p + "mlp.gate_proj.weight", (I, h), "w"
        yield p + "mlp.up_proj.weight", (I, h), "w"
        yield p + "mlp.down_proj.weight", (h, I), "w"
    yield "model.norm.weight", (h,), "n0"


def qwen3_moe_config(base, s, n_layers):
    c = dict(base)
    c.update({k: v for k, v in s.items() if k != "family"})
    c.update(num_hidden_layers=n_layers, max_position_embeddings=40960, mlp_only_layers=[],
             decoder_sparse_step=1)
    c["rope_parameters"] = {"rope_theta": 1000000.0, "rope_type": "default"}
    return c


def qwen3_moe_tensors(c):
    h, V, E, F = (c["hidden_size"], c["vocab_size"], c["num_local_experts"],
                  c["moe_intermediate_size"])
    H, KV, hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    yield "model.embed_tokens.weight", (V, h), "w"
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,), "n1"
        yield p + "post_attention_layernorm.weight", (h,), "n1"
        a = p + "self_attn."
        yield a + "q_proj.weight", (H * hd, h), "w"
        yield a + "k_proj.weight", (KV * hd, h), "w"
        yield a + "v_proj.weight", (KV * hd, h), "w"
        yield a + "o_proj.weight", (h, H * hd), "w"
        yield a + "q_norm.weight", (hd,), "n1"
        yield a + "k_norm.weight", (hd,), "n1"
        yield p + "mlp.gate.weight", (E, h), "router"
        for e in range(E):  # the HF layout: one tensor per expert and projection
            x = f"{p}mlp.experts.{e}."
            yield x + "gate_proj.weight", (F, h), "w"
            yield x + "up_proj.weight", (F, h), "w"
            yield x + "down_proj.weight", (h, F), "w"
    yield "model.norm.weight", (h,), "n1"
    if not c["tie_word_embeddings"]:
        yield "lm_head.weight", (V, h), "w"


def gemma4_tensors(c):
    h, V, P = c["hidden_size"], c["vocab_size"], c["hidden_size_per_layer_input"]
    n = c["num_hidden_layers"]
    H, KV, I = c["num_attention_heads"], c["num_key_value_heads"], c["intermediate_size"]
    first_shared = n - c["num_kv_shared_layers"]
    yield "model.embed_tokens.weight", (V, h), "w"
    yield "model.embed_tokens_per_layer.weight", (c["vocab_size_per_layer_input"], n * P), "w"
    yield "model.per_layer_model_projection.weight", (n * P, h), "w"
    yield "model.per_layer_projection_norm.weight", (P,), "n1"
    for i, t in enumerate(c["layer_types"]):
        p = f"model.layers.{i}."
        hd = c["global_head_dim"] if t == "full_attention" else c["head_dim"]
        for nm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm", "post_per_layer_input_norm"):
            yield p + nm + ".weight", (h,), "n1"
        yield p + "layer_scalar", (1,), "one"
        yield p + "self_attn.q_proj.weight", (H * hd, h), "w"
        yield p + "self_attn.q_norm.weight", (hd,), "n1"
        yield p + "self_attn.o_proj.weight", (h, H * hd), "w"
        if i < first_shared:
            yield p + "self_attn.k_proj.weight", (KV * hd, h), "w"
            yield p + "self_attn.v_proj.weight", (KV * hd, h), "w"
            yield p + "self_attn.k_norm.weight", (hd,), "n1"
        yield p + "mlp.gate_proj.weight", (I, h), "w"
        yield p + "mlp.up_proj.weight", (I, h), "w"
        yield p + "mlp.down_proj.weight", (h, I), "w"
        yield p + "per_layer_input_gate.weight", (P, h), "w"
        yield p + "per_layer_projection.weight", (h, P), "w"
    yield "model.norm.weight", (h,), "n1"


def bf16(x):
    u = x.astype(np.float32).view(np.uint32)
    u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # round to nearest even
    return u.astype(np.uint16)


def values(kind, shape, pool, rng):
    n = int(np.prod(shape))
    if kind == "w":  # a random window of the pool, cycled for tensors larger than it
        out = np.empty(n, np.uint16)
        done = 0
        while done < n:
            off = int(rng.integers(0, pool.size // 2))
            take = min(n - done, pool.size - off)
            out[done:done + take] = pool[off:off + take]
            done += take
        return out
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "n0":  # (1+w) norms: w near 0
        x *= 0.02
    elif kind == "n1":  # plain norms: w near 1
        x = 1.0 + 0.02 * x
    elif kind == "router":  # logits of a few units: routes spread over the experts
        x *= 0.5
    elif kind == "one":
        x[:] = 1.0
    elif kind == "conv":
        x *= 0.3
    elif kind == "alog":  # decay rates exp(A_log) in [1, 16], as trained models have
        x = np.log(rng.uniform(1.0, 16.0, n)).astype(np.float32)
    elif kind == "dt":
        x = rng.uniform(-2.0, 1.0, n).astype(np.float32)
    return bf16(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--layers", type=int, default=0, help="keep the first N layers (0: all)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    s = SHAPES[a.shape]
    with open(os.path.join(FIXTURES, s["family"], "config.json")) as f:
        base = json.load(f)
    n_real = s["num_hidden_layers"]
    n = a.layers if 0 < a.layers < n_real else n_real
    if s["family"] == "qwen3_5_text":
        c = qwen35_config(base, s, n)
        specs = list(qwen35_tensors(c))
    elif s["family"] == "qwen3_moe":
        c = qwen3_moe_config(base, s, n)
        specs = list(qwen3_moe_tensors(c))
    else:
        c = gemma4_config(base, s, n_real, n)
        specs = list(gemma4_tensors(c))
    c["bos_token_id"], c["eos_token_id"], c["pad_token_id"] = 2, 1, 0
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    header, off = {}, 0
    for name, shape, _ in specs:
        nb = int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nb]}
        off += nb
    header["__metadata__"] = {"format": "pt"}
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    rng = np.random.default_rng(a.seed)
    pool = bf16(rng.standard_normal(1 << 24, dtype=np.float32) * np.float32(0.02))
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for name, shape, kind in specs:
            values(kind, shape, pool, rng).tofile(f)
    print(f"wrote {a.out}: {a.shape}, {n}/{n_real} layers, {off / 2e9:.2f}B parameters, "
          f"{off / 1e9:.2f} GB of bf16 weights")


if __name__ == "__main__":
    main()
