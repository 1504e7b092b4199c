/* cmd_tokenize.c — placeholder for `kiln tokenize` until its module lands. */
#include "cli.h"

int cmd_tokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'tokenize' is not available in this build yet");
}
