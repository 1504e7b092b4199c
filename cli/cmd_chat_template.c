/* cmd_chat_template.c — placeholder for `kiln chat-template` until its module lands. */
#include "cli.h"

int cmd_chat_template(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return cli_error("'chat-template' is not available in this build yet");
}
