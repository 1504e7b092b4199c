/* cmd_chat_template.c — `kiln chat-template`: renders a model's chat template over a conversation
 * (as transformers.apply_chat_template(tokenize=False) would) and prints the prompt. With
 * --template FILE it renders a template file directly, without a model. */
#include "cli.h"
#include "tokenizer/chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: kiln chat-template [--model DIR | --template FILE] --messages FILE.json\n"
        "                          [--add-generation-prompt] [--tools FILE.json]\n"
        "                          [--kwargs JSON] [--bos TEXT] [--eos TEXT]\n"
        "Prints the model's chat template rendered over the messages (a JSON array of\n"
        "{\"role\", \"content\", ...} objects), exactly as transformers' apply_chat_template\n"
        "with tokenize=False.\n"
        "  --model DIR               model folder (tokenizer_config.json / chat_template.jinja)\n"
        "  --template FILE           render this Jinja template instead of a model's\n"
        "  --messages FILE.json      the conversation ('-' reads stdin)\n"
        "  --add-generation-prompt   end with the assistant turn header\n"
        "  --tools FILE.json         JSON array of tool (function) schemas\n"
        "  --kwargs JSON             extra template variables, e.g. '{\"enable_thinking\":false}'\n"
        "  --bos TEXT, --eos TEXT    bos_token / eos_token for --template\n"
        "strftime_now uses today's date unless KILN_CHAT_DATE=YYYY-MM-DD is set.\n");
}

static char *read_all(const char *path) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (cap - n < 2) {
            char *p = realloc(buf, cap *= 2);
            if (!p) {
                free(buf);
                buf = NULL;
            }
            buf = p;
        }
    }
    if (buf) buf[n] = 0;
    if (f != stdin) fclose(f);
    return buf;
}

int cmd_chat_template(int argc, char **argv) {
    const char *model = NULL, *template_path = NULL, *messages_path = NULL, *tools_path = NULL;
    const char *kwargs = NULL, *bos = NULL, *eos = NULL;
    bool agp = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = NULL;
        if (cli_is_help(a)) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--add-generation-prompt")) {
            agp = true;
            continue;
        } else if (!strcmp(a, "--model"))
            dst = &model;
        else if (!strcmp(a, "--template"))
            dst = &template_path;
        else if (!strcmp(a, "--messages"))
            dst = &messages_path;
        else if (!strcmp(a, "--tools"))
            dst = &tools_path;
        else if (!strcmp(a, "--kwargs"))
            dst = &kwargs;
        else if (!strcmp(a, "--bos"))
            dst = &bos;
        else if (!strcmp(a, "--eos"))
            dst = &eos;
        else {
            usage(stderr);
            return cli_error("chat-template: unknown option '%s'", a);
        }
        if (!(*dst = cli_value(argc, argv, &i))) return 2;
    }
    if (!messages_path) {
        usage(stderr);
        return cli_error("chat-template: --messages is required");
    }
    if (model && template_path)
        return cli_error("chat-template: give --model or --template, not both");
    char *messages = read_all(messages_path);
    if (!messages) return cli_error("chat-template: cannot read %s", messages_path);
    char *tools = NULL;
    if (tools_path && !(tools = read_all(tools_path))) {
        free(messages);
        return cli_error("chat-template: cannot read %s", tools_path);
    }
    char *out = NULL;
    kiln_status st;
    if (template_path) {
        char *tmpl = read_all(template_path);
        if (!tmpl) {
            free(messages);
            free(tools);
            return cli_error("chat-template: cannot read %s", template_path);
        }
        st = kiln_chat_template_render(tmpl, messages, tools, agp, bos, eos, kwargs, &out);
        free(tmpl);
    } else {
        kiln_tokenizer *tok = NULL;
        st = kiln_tokenizer_load(model ? model : cli_default_model_dir(), &tok);
        if (st == KILN_OK) {
            st = kiln_chat_render(tok, messages, tools, agp, kwargs, &out);
            kiln_tokenizer_free(tok);
        }
    }
    free(messages);
    free(tools);
    if (st != KILN_OK) return cli_fail_status(st, "chat-template");
    fputs(out, stdout);
    free(out);
    return 0;
}
