#!/usr/bin/python3
"""gemma4_moe_ref.py — a tiny random Gemma 4 text model with the MoE block (enable_moe_block) and
its logits from a float64 numpy forward, for test_families.

NOT a transformers-generated reference: no shared fixture exercises Gemma 4's MoE block, so this
file re-derives the math from transformers' modeling_gemma4.py (Gemma4TextDecoderLayer.forward,
Gemma4TextRouter, Gemma4TextExperts) in numpy. It checks kiln against that reading of the source,
not against transformers itself.

    /usr/bin/python3 tests/gemma4_moe_ref.py OUT_DIR
writes OUT_DIR/{config.json, model.safetensors (f32), input_ids.json, logits.f32 [T, vocab]}.
"""
import json
import os
import struct
import sys

import numpy as np

H, NH, NKV, HD, FF, E, K, MF, V, EPS = 64, 4, 2, 16, 96, 6, 2, 40, 128, 1e-6
TYPES = ["sliding_attention", "full_attention"]
THETA = {"sliding_attention": 10000.0, "full_attention": 1000000.0}
CAP = 30.0


def config():
    return {
        "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text",
        "hidden_size": H, "num_hidden_layers": len(TYPES), "num_attention_heads": NH,
        "num_key_value_heads": NKV, "head_dim": HD, "intermediate_size": FF, "vocab_size": V,
        "rms_norm_eps": EPS, "layer_types": TYPES, "sliding_window": 512,
        "rope_parameters": {t: {"rope_type": "default", "rope_theta": THETA[t]} for t in TYPES},
        "final_logit_softcapping": CAP, "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0, "attention_k_eq_v": False, "tie_word_embeddings": True,
        "enable_moe_block": True, "num_experts": E, "top_k_experts": K,
        "moe_intermediate_size": MF, "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
        "attention_bias": False, "torch_dtype": "float32",
    }


def weights(rng):
    w = {}
    def mat(*shape, std=0.15):
        return (rng.standard_normal(shape) * std).astype(np.float32)
    def norm(n):  # Gemma 4 norms are plain w: near 1, perturbed so an ignored one fails
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)
    w["model.embed_tokens.weight"] = mat(V, H, std=0.5)
    for i in range(len(TYPES)):
        p = f"model.layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm", "pre_feedforward_layernorm_2",
                  "post_feedforward_layernorm_1", "post_feedforward_layernorm_2"):
            w[p + n + ".weight"] = norm(H)
        w[p + "layer_scalar"] = np.array([0.8 + 0.1 * i], np.float32)
        w[p + "self_attn.q_proj.weight"] = mat(NH * HD, H)
        w[p + "self_attn.k_proj.weight"] = mat(NKV * HD, H)
        w[p + "self_attn.v_proj.weight"] = mat(NKV * HD, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, NH * HD)
        w[p + "self_attn.q_norm.weight"] = norm(HD)
        w[p + "self_attn.k_norm.weight"] = norm(HD)
        w[p + "mlp.gate_proj.weight"] = mat(FF, H)
        w[p + "mlp.up_proj.weight"] = mat(FF, H)
        w[p + "mlp.down_proj.weight"] = mat(H, FF)
        w[p + "router.proj.weight"] = mat(E, H, std=1.0)
        w[p + "router.scale"] = norm(H)
        w[p + "router.per_expert_scale"] = rng.uniform(0.5, 1.5, E).astype(np.float32)
        w[p + "experts.gate_up_proj"] = mat(E, 2 * MF, H)
        w[p + "experts.down_proj"] = mat(E, H, MF)
    w["model.norm.weight"] = norm(H)
    return w


def rms(x, w=None):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)
    return y * w if w is not None else y


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def rope(x, theta):  # x [T, heads, HD], rotate_half layout
    T = x.shape[0]
    inv = theta ** (-np.arange(0, HD, 2, dtype=np.float64) / HD)
    ang = np.arange(T)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def forward(w, ids):
    g = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(ids)
    x = g["model.embed_tokens.weight"][ids] * np.sqrt(H)
    min_gap = np.inf
    for i, t in enumerate(TYPES):
        p = f"model.layers.{i}."
        r = x
        h = rms(x, g[p + "input_layernorm.weight"])
        q = (h @ g[p + "self_attn.q_proj.weight"].T).reshape(T, NH, HD)
        k = (h @ g[p + "self_attn.k_proj.weight"].T).reshape(T, NKV, HD)
        v = (h @ g[p + "self_attn.v_proj.weight"].T).reshape(T, NKV, HD)
        q = rope(rms(q, g[p + "self_attn.q_norm.weight"]), THETA[t])
        k = rope(rms(k, g[p + "self_attn.k_norm.weight"]), THETA[t])
        v = rms(v)  # v_norm has no weight
        o = np.zeros((T, NH, HD))
        mask = np.triu(np.full((T, T), -np.inf), 1)
        for hh in range(NH):
            kv = hh // (NH // NKV)
            s = q[:, hh] @ k[:, kv].T + mask  # attention scale 1.0
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, kv]
        a = o.reshape(T, NH * HD) @ g[p + "self_attn.o_proj.weight"].T
        x = r + rms(a, g[p + "post_attention_layernorm.weight"])
        r = x
        h = rms(r, g[p + "pre_feedforward_layernorm.weight"])
        m = (gelu_tanh(h @ g[p + "mlp.gate_proj.weight"].T) * (h @ g[p + "mlp.up_proj.weight"].T)) \
            @ g[p + "mlp.down_proj.weight"].T
        h1 = rms(m, g[p + "post_feedforward_layernorm_1.weight"])
        # router on the residual (before any feed-forward norm)
        rn = rms(r) * g[p + "router.scale"] * H ** -0.5
        sc = rn @ g[p + "router.proj.weight"].T
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        xe = rms(r, g[p + "pre_feedforward_layernorm_2.weight"])
        y = np.zeros((T, H))
        for tt in range(T):
            order = np.argsort(-pr[tt])
            min_gap = min(min_gap, pr[tt, order[K - 1]] - pr[tt, order[K]])
            top = order[:K]
            wt = pr[tt, top] / pr[tt, top].sum() * g[p + "router.per_expert_scale"][top]
            for e, we in zip(top, wt):
                gu = g[p + "experts.gate_up_proj"][e] @ xe[tt]
                y[tt] += we * (g[p + "experts.down_proj"][e] @ (gelu_tanh(gu[:MF]) * gu[MF:]))
        h2 = rms(y, g[p + "post_feedforward_layernorm_2.weight"])
        x = r + rms(h1 + h2, g[p + "post_feedforward_layernorm.weight"])
        x = x * g[p + "layer_scalar"][0]
    x = rms(x, g["model.norm.weight"])
    logits = x @ g["model.embed_tokens.weight"].T
    return CAP * np.tanh(logits / CAP), min_gap


def write_safetensors(path, w):
    header, off = {}, 0
    for name, a in w.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + a.nbytes]}
        off += a.nbytes
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for a in w.values():
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(2024)
    w = weights(rng)
    ids = [1, 17, 93, 5, 64, 127, 33, 8, 71]
    logits, gap = forward(w, ids)
    # routing must not hinge on rounding: the k-th and (k+1)-th expert are clearly apart
    assert gap > 1e-3, f"top-k gap {gap} too small; pick another seed"
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(), f, indent=1)
    write_safetensors(os.path.join(out, "model.safetensors"), w)
    with open(os.path.join(out, "input_ids.json"), "w") as f:
        json.dump(ids, f)
    logits.astype("<f4").tofile(os.path.join(out, "logits.f32"))
    print(f"{out}: {len(ids)} tokens, min top-k probability gap {gap:.3g}")


if __name__ == "__main__":
    main()
