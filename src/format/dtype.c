/* dtype.c — names and sizes of kiln_dtype values (safetensors spellings). */
#include "format/dtype.h"

#include <string.h>

static const struct {
    const char *name;
    size_t size;
} dtype_table[KILN_DT_COUNT] = {
    [KILN_DT_F32] = {"F32", 4}, [KILN_DT_F16] = {"F16", 2}, [KILN_DT_BF16] = {"BF16", 2},
    [KILN_DT_U32] = {"U32", 4}, [KILN_DT_I32] = {"I32", 4}, [KILN_DT_I64] = {"I64", 8},
    [KILN_DT_U8] = {"U8", 1},   [KILN_DT_I8] = {"I8", 1},   [KILN_DT_BOOL] = {"BOOL", 1},
    [KILN_DT_F64] = {"F64", 8},
};

size_t kiln_dtype_size(kiln_dtype dt) {
    return (unsigned)dt < KILN_DT_COUNT ? dtype_table[dt].size : 0;
}

const char *kiln_dtype_name(kiln_dtype dt) {
    return (unsigned)dt < KILN_DT_COUNT ? dtype_table[dt].name : "?";
}

int kiln_dtype_parse(const char *name, kiln_dtype *out) {
    for (int i = 0; i < KILN_DT_COUNT; i++) {
        if (strcmp(name, dtype_table[i].name) == 0) {
            *out = (kiln_dtype)i;
            return 0;
        }
    }
    return -1;
}
