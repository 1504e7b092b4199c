/* cmd_info.c — `kiln info`: what a model folder holds: architecture, sizes, parameter count,
 * quantization per module kind, bytes of weights, KV bytes per token, layer pattern. */
#include "cli.h"

#include <string.h>

static void help(FILE *f) {
    fprintf(f, "usage: kiln info [--model DIR]\n\n");
    cli_model_opts_help(f);
}

int cmd_info(int argc, char **argv) {
    cli_model_opts mo;
    cli_model_opts_init(&mo);
    mo.load.show_progress = false;
    mo.load.weights =
        KILN_WEIGHTS_MMAP; /* info runs nothing: reading the files in would be waste */
    for (int i = 1; i < argc; i++) {
        int r = cli_model_opts_parse(&mo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (cli_is_help(argv[i])) {
            help(stdout);
            return 0;
        }
        return cli_error("info: unknown option '%s' (see kiln info --help)", argv[i]);
    }
    kiln_model *model = cli_load_model(&mo);
    if (!model) return 1;
    const kiln_model_info *in = kiln_model_get_info(model);
    printf("model:          %s\n", mo.model_dir ? mo.model_dir : cli_default_model_dir());
    printf("architecture:   %s\n", in->architecture);
    printf("parameters:     %lld (%.2fM)\n", (long long)in->n_params, in->n_params / 1e6);
    printf("weights:        %lld bytes (%.2f MB)", (long long)in->weight_bytes,
           in->weight_bytes / 1e6);
    if (in->active_weight_bytes != in->weight_bytes)
        printf(", %.2f MB read per decoded token (routed experts)", in->active_weight_bytes / 1e6);
    printf("\n");
    printf("layers:         %d  [%s]  (F full attention, S sliding window, L linear; +M MoE MLP)\n",
           in->n_layers, in->layer_pattern);
    printf("hidden:         %d, heads %d, kv heads %d, head dim %d\n", in->hidden_size, in->n_heads,
           in->n_kv_heads, in->head_dim);
    if (in->n_experts > 0)
        printf("experts:        %d per MoE layer, %d per token\n", in->n_experts,
               in->experts_per_token);
    printf("vocabulary:     %d\n", in->vocab_size);
    printf("context:        %d\n", in->max_position);
    printf("kv cache:       %s, %lld bytes per token", mo.load.kv.kind,
           (long long)in->kv_bytes_per_token);
    if (in->state_bytes_fixed)
        printf(" + %lld bytes fixed state per sequence", (long long)in->state_bytes_fixed);
    printf("\n");
    printf("quantization:   %s\n", in->quant_summary);
    printf("bos / eos:      %d /", in->bos_id);
    for (int i = 0; i < in->n_eos; i++) printf(" %d", in->eos_ids[i]);
    printf("\n");
    kiln_model_free(model);
    return 0;
}
