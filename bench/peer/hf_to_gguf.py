#!/usr/bin/python3
"""hf_to_gguf.py — write a Qwen3 or Llama Hugging Face folder (config.json + bf16 safetensors) as a bf16 GGUF
for llama.cpp, using only numpy and llama.cpp's own gguf-py (pass its path with --gguf-py).

llama.cpp's convert_hf_to_gguf.py imports torch, which this machine cannot install (only Debian apt
and npm are reachable), so this is the minimal subset of it the peer benchmark needs: qwen3 metadata,
tensors renamed through gguf-py's TensorNameMap (2-D weights bf16 as stored, 1-D norms f32, as the
upstream converter does), and a byte-level BPE tokenizer ("gpt2", pre "gpt-2") taken from
tokenizer.json. When the config's vocab is larger than the tokenizer's (the random-weight model),
the vocabulary is padded with unused control tokens so llama.cpp accepts it; llama-bench only feeds
random token ids, so the tokenizer content does not affect its timings. Llama's q/k projections are
written as stored (upstream permutes their rows for llama.cpp's RoPE layout): right for timing a
random-weight model, wrong for using a real one.

Nothing here is llama.cpp code; gguf-py is imported from the llama.cpp tree built outside the repo.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np


def read_safetensors(path):
    """Yield (name, dtype string, shape, raw uint8 view) from one safetensors file (memory-mapped)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        yield name, info["dtype"], info["shape"], data[a:b]


def to_f32(dtype, shape, raw):
    if dtype == "BF16":
        u = raw.view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    if dtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(shape)
    if dtype == "F32":
        return raw.view(np.float32).reshape(shape)
    raise SystemExit(f"unsupported dtype {dtype}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True, help="HF folder: config.json, *.safetensors, tokenizer.json")
    ap.add_argument("--out", required=True, help="output .gguf")
    ap.add_argument("--gguf-py", required=True, help="llama.cpp's gguf-py folder")
    ap.add_argument("--tokenizer", help="tokenizer.json to embed (default: the model's)")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    try:  # gguf-py's metadata module imports yaml; the writer never uses it (the GPU machine may lack it)
        import yaml  # noqa: F401
    except ImportError:
        import types
        sys.modules["yaml"] = types.ModuleType("yaml")
    import gguf

    cfg = json.load(open(os.path.join(args.model, "config.json")))
    archs = {"qwen3": gguf.MODEL_ARCH.QWEN3, "llama": gguf.MODEL_ARCH.LLAMA}
    if cfg.get("model_type") not in archs:
        raise SystemExit("only qwen3 and llama are supported")
    arch = archs[cfg["model_type"]]
    L = cfg["num_hidden_layers"]
    H = cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // H
    rope = cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
    V = cfg["vocab_size"]

    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(os.path.basename(os.path.normpath(args.model)))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    w.add_context_length(cfg.get("max_position_embeddings", 4096))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(L)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(float(rope))
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(float(cfg.get("rms_norm_eps", 1e-6)))

    # tokenizer: byte-level BPE as "gpt2"
    tj = json.load(open(args.tokenizer or os.path.join(args.model, "tokenizer.json")))
    vocab = tj["model"]["vocab"]
    added = {t["id"]: t for t in tj.get("added_tokens", [])}
    n_tok = max(V, max(vocab.values()) + 1, max(added) + 1 if added else 0)
    toks = [None] * n_tok
    types = [gguf.TokenType.NORMAL] * n_tok
    for s, i in vocab.items():
        toks[i] = s
    for i, t in added.items():
        toks[i] = t["content"]
        types[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    for i in range(n_tok):
        if toks[i] is None:
            toks[i] = f"<|kiln_pad_{i}|>"
            types[i] = gguf.TokenType.UNUSED
    merges = tj["model"].get("merges", [])
    merges = [" ".join(m) if isinstance(m, list) else m for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    eos = cfg.get("eos_token_id", 0)
    eos = eos[0] if isinstance(eos, list) else eos
    w.add_eos_token_id(int(eos))
    w.add_bos_token_id(int(cfg.get("bos_token_id") or eos))
    w.add_add_bos_token(False)

    tmap = gguf.get_tensor_name_map(arch, L)
    files = sorted(f for f in os.listdir(args.model) if f.endswith(".safetensors"))
    for fn in files:
        for name, dt, shape, raw in read_safetensors(os.path.join(args.model, fn)):
            if name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                continue
            new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise SystemExit(f"cannot map tensor {name}")
            if len(shape) == 1 or dt != "BF16":
                w.add_tensor(new, np.ascontiguousarray(to_f32(dt, shape, raw)))
            else:  # bf16 raw bytes, shape given in bytes (gguf-py derives element shape)
                w.add_tensor(new, np.asarray(raw).reshape(shape[0], -1), raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
