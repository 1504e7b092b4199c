/* cmd_detokenize.c — placeholder for `kiln detokenize` until its module lands. */
#include "cli.h"

int cmd_detokenize(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'detokenize' is not available in this build yet");
}
