/* convert.h — `kiln convert`: turns a Hugging Face model folder (f32/f16/bf16 safetensors) into
 * the mlx-community layout, optionally MLX-affine-quantizing every Linear/Embedding weight
 * (<m>.weight uint32 codes + <m>.scales + <m>.biases) and casting the remaining tensors. */
#ifndef KILN_CONVERT_CONVERT_H
#define KILN_CONVERT_CONVERT_H

#include "format/dtype.h"
#include "kiln.h"

typedef struct kiln_convert_options {
    const char *src_dir; /* HF model folder (config.json + safetensors) */
    const char *dst_dir; /* created if missing */
    int bits;            /* 0: no quantization; else 2..8 */
    int group_size;      /* 32, 64 (default) or 128 */
    bool cast;           /* cast unquantized float tensors to `dtype` */
    kiln_dtype dtype;    /* F32, F16 or BF16 (only when cast) */
    bool progress;       /* "tensor i/N" lines on stderr */
} kiln_convert_options;

void kiln_convert_options_default(kiln_convert_options *o);

/* Converts o->src_dir into o->dst_dir: model.safetensors, config.json (+ "quantization" and
 * "quantization_config" blocks when quantizing) and the tokenizer/generation files. */
kiln_status kiln_convert(const kiln_convert_options *o);

/* Is this tensor quantized by convert (a 2-D/3-D Linear or Embedding "*.weight" whose last dim
 * is a multiple of group_size; not norms, conv1d or biases)? */
bool kiln_convert_is_quantizable(const char *name, int ndim, const int64_t *shape, int group_size);

#endif
