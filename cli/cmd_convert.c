/* cmd_convert.c — placeholder for `kiln convert` until its module lands. */
#include "cli.h"

int cmd_convert(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'convert' is not available in this build yet");
}
