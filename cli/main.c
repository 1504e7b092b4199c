/* main.c — `kiln` entry point: dispatches to one verb per file (cli/cmd_<verb>.c). */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    cli_verb_fn fn;
    const char *summary;
} verbs[] = {
    {"generate", cmd_generate, "generate text from a prompt (streams tokens)"},
    {"logits", cmd_logits, "write float32 logits [T, vocab] of one forward pass"},
    {"tokenize", cmd_tokenize, "print token ids of a text as a JSON array"},
    {"detokenize", cmd_detokenize, "print the text of token ids"},
    {"chat-template", cmd_chat_template, "render a conversation with the model's chat template"},
    {"perplexity", cmd_perplexity, "mean negative log-likelihood over windows of token ids"},
    {"convert", cmd_convert, "convert a model folder (e.g. to MLX 8/4-bit affine)"},
    {"info", cmd_info, "describe a model: architecture, sizes, quantization, KV bytes"},
    {"bench", cmd_bench, "measure prefill and decode speed"},
    {"serve", cmd_serve, "OpenAI- and Anthropic-compatible HTTP server"},
};

static void usage(FILE *f) {
    fprintf(f,
            "usage: kiln <verb> [options]   (kiln <verb> --help for a verb's options)\n\nverbs:\n");
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        fprintf(f, "  %-14s %s\n", verbs[i].name, verbs[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (cli_is_help(argv[1])) {
        usage(stdout);
        return 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kiln 0.1.0\n");
        return 0;
    }
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0]; i++)
        if (strcmp(argv[1], verbs[i].name) == 0) return verbs[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kiln: unknown verb '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
