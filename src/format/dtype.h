/* dtype.h — element types of tensors in model files and their sizes. */
#ifndef KILN_FORMAT_DTYPE_H
#define KILN_FORMAT_DTYPE_H

#include <stddef.h>

typedef enum kiln_dtype {
    KILN_DT_F32 = 0,
    KILN_DT_F16,
    KILN_DT_BF16,
    KILN_DT_U32,
    KILN_DT_I32,
    KILN_DT_I64,
    KILN_DT_U8,
    KILN_DT_I8,
    KILN_DT_BOOL,
    KILN_DT_F64,
    KILN_DT_COUNT
} kiln_dtype;

size_t kiln_dtype_size(kiln_dtype dt);
const char *kiln_dtype_name(kiln_dtype dt); /* safetensors spelling: "F32", "BF16", ... */
/* Parses a safetensors dtype string; returns 0 and sets *out, or -1 if unknown. */
int kiln_dtype_parse(const char *name, kiln_dtype *out);

#endif
