/* cmd_convert.c — `kiln convert`: option parsing and help for HF -> mlx-community conversion
 * (the work is in src/convert/convert.c). */
#include "cli.h"
#include "convert/convert.h"

#include <string.h>
#include <unistd.h>

static void convert_help(FILE *f) {
    fprintf(f,
            "usage: kiln convert --model SRC_DIR --out DST_DIR [--bits B] [--group G] [--dtype T]\n"
            "\n"
            "Converts a Hugging Face model folder (safetensors, f32/f16/bf16) into the\n"
            "mlx-community layout. With --bits, every Linear/Embedding weight whose last\n"
            "dimension is a multiple of the group size is MLX-affine quantized into\n"
            "<m>.weight (uint32 codes), <m>.scales and <m>.biases (f16); norms, conv1d and\n"
            "biases are copied. MoE routers are kept at 8 bits / group 64. Tied models get no\n"
            "lm_head. config.json gains a \"quantization\" block; tokenizer and generation files\n"
            "are copied.\n"
            "\n"
            "options:\n"
            "  --model, -m DIR   source folder (config.json + *.safetensors)\n"
            "  --out, -o DIR     output folder (created if missing)\n"
            "  --bits B          quantize to B bits (2..8); omit to copy/cast only\n"
            "  --group G         quantization group size: 32, 64 (default) or 128\n"
            "  --dtype T         cast unquantized float tensors to bf16, f16 or f32\n"
            "  --quiet           no progress output\n");
}

int cmd_convert(int argc, char **argv) {
    kiln_convert_options o;
    kiln_convert_options_default(&o);
    o.progress = true;
    long long n;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (cli_is_help(a)) {
            convert_help(stdout);
            return 0;
        } else if (strcmp(a, "--model") == 0 || strcmp(a, "-m") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            o.src_dir = v;
        } else if (strcmp(a, "--out") == 0 || strcmp(a, "-o") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            o.dst_dir = v;
        } else if (strcmp(a, "--bits") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 2, 8, &n)) return cli_error("--bits: '%s' is not 2..8", v);
            o.bits = (int)n;
        } else if (strcmp(a, "--group") == 0 || strcmp(a, "--group-size") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            if (!cli_parse_int(v, 1, 1 << 20, &n) || (n != 32 && n != 64 && n != 128))
                return cli_error("--group: '%s' is not 32, 64 or 128", v);
            o.group_size = (int)n;
        } else if (strcmp(a, "--dtype") == 0) {
            if (!(v = cli_value(argc, argv, &i))) return 2;
            o.cast = true;
            if (strcmp(v, "bf16") == 0)
                o.dtype = KILN_DT_BF16;
            else if (strcmp(v, "f16") == 0)
                o.dtype = KILN_DT_F16;
            else if (strcmp(v, "f32") == 0)
                o.dtype = KILN_DT_F32;
            else
                return cli_error("--dtype: '%s' is not bf16, f16 or f32", v);
        } else if (strcmp(a, "--quiet") == 0) {
            o.progress = false;
        } else {
            cli_error("convert: unknown option '%s'", a);
            convert_help(stderr);
            return 2;
        }
    }
    if (!o.src_dir) return cli_error("convert: --model SRC_DIR is required (see --help)");
    if (!o.dst_dir) return cli_error("convert: --out DST_DIR is required (see --help)");
    kiln_status st = kiln_convert(&o);
    if (st != KILN_OK) return cli_fail_status(st, "convert failed");
    fprintf(stderr, "kiln convert: wrote %s\n", o.dst_dir);
    return 0;
}
