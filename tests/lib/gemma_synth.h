/* gemma_synth.h — a tiny random Gemma 4 text checkpoint (config.json + bf16 model.safetensors)
 * that exercises every path of gemma.c no shared fixture has: the MoE block, per-layer inputs,
 * layer_scalar, KV-shared tail layers (kv_src), attention_k_eq_v with num_global_key_value_heads,
 * a larger global_head_dim with proportional partial RoPE, and a sliding window short enough that
 * decoding crosses it. For backend-vs-backend checks (its logits are not a transformers
 * reference). */
#ifndef KILN_TEST_GEMMA_SYNTH_H
#define KILN_TEST_GEMMA_SYNTH_H

#include <stdbool.h>

/* Writes the checkpoint into dir (created if missing); moe false: without the MoE block (no
 * router or expert tensors). Returns false on an I/O error. */
bool gemma_synth_write(const char *dir, bool moe);

#endif
