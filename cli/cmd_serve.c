/* cmd_serve.c — placeholder for `kiln serve` until its module lands. */
#include "cli.h"

int cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'serve' is not available in this build yet");
}
