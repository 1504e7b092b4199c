/* chat_template.h — renders a Jinja2 chat template over a conversation the way
 * transformers.apply_chat_template(tokenize=False) does (trim_blocks, lstrip_blocks, HF tojson,
 * raise_exception, strftime_now). The tokenizer glue (kiln_chat_render) calls this. */
#ifndef KILN_TOKENIZER_CHAT_TEMPLATE_H
#define KILN_TOKENIZER_CHAT_TEMPLATE_H

#include "kiln.h"

#include <stdbool.h>

/* messages_json: JSON array of messages; tools_json: JSON array or NULL; bos_token / eos_token:
 * NULL leaves them undefined; kwargs_json: JSON object of extra template variables or NULL.
 * On success *out is a malloc'd NUL-terminated string. Template errors come back as
 * KILN_ERR_FORMAT with "chat template line N: ..." in kiln_last_error(). strftime_now uses the
 * current local time unless the environment variable KILN_CHAT_DATE holds a fixed date
 * "YYYY-MM-DD" (for reproducible tests). */
kiln_status kiln_chat_template_render(const char *template_src, const char *messages_json,
                                      const char *tools_json, bool add_generation_prompt,
                                      const char *bos_token, const char *eos_token,
                                      const char *kwargs_json, char **out);

#endif
