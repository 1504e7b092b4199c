/* cli.h — shared pieces of the `kiln` command-line tool: the verb signature, option parsing
 * helpers and the common model options (--model, --device, --threads, --kv ...). */
#ifndef KILN_CLI_H
#define KILN_CLI_H

#include "kiln.h"

#include <stdbool.h>
#include <stdio.h>

typedef int (*cli_verb_fn)(int argc, char **argv); /* argv[0] is the verb name */

/* Verbs (one file each: cli/cmd_<verb>.c). Return the process exit code. */
int cmd_generate(int argc, char **argv);
int cmd_logits(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_chat_template(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Options common to verbs that load a model. */
typedef struct cli_model_opts {
    const char *model_dir; /* NULL -> bundled default */
    kiln_load_options load;
    bool verbose;
} cli_model_opts;

void cli_model_opts_init(cli_model_opts *o);
/* If argv[*i] is a common model option, consumes it (and its value), returns 1; returns -1 on a
 * bad value (message printed), 0 if not a common option. */
int cli_model_opts_parse(cli_model_opts *o, int argc, char **argv, int *i);
/* Help text for the common options. */
void cli_model_opts_help(FILE *f);
/* The bundled default model folder (models/demo-q8 next to the binary's source tree). */
const char *cli_default_model_dir(void);
/* Loads the model named by o (prints the error and returns NULL on failure). */
kiln_model *cli_load_model(const cli_model_opts *o);

/* Value of option argv[*i] (advances *i); prints an error and returns NULL if missing. */
const char *cli_value(int argc, char **argv, int *i);
bool cli_parse_int(const char *s, long long lo, long long hi, long long *out);
bool cli_parse_float(const char *s, double *out);
/* Parses "1,2,3" into a malloc'd array. Returns false (message printed) on bad input. */
bool cli_parse_ids(const char *s, int32_t **ids, int *n);
bool cli_is_help(const char *arg);
int cli_error(const char *fmt, ...) __attribute__((format(printf, 1, 2))); /* prints, returns 2 */
int cli_fail_status(kiln_status st, const char *what); /* prints kiln_last_error, returns 1 */

#endif
