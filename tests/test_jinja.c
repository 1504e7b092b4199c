/* test_jinja.c — unit tests of the chat-template Jinja interpreter, one group per construct
 * (expressions, statements, whitespace control, filters, tests, methods, globals) and every error
 * path (unknown filter/test/tag, unclosed blocks, syntax errors with their line, raise_exception,
 * recursion, size and step limits, bad inputs). Expected strings are what Jinja2 3.x with
 * transformers' settings (trim_blocks, lstrip_blocks, HF tojson) produces. */
#include "kiln.h"
#include "test_util.h"
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>

static const char *MSGS = "[{\"role\":\"user\",\"content\":\"Hi!\"},"
                          "{\"role\":\"assistant\",\"content\":\"Yo\"}]";
static const char *VARS = "{\"x\":[1,2,3,4],\"d\":{\"a\":1},\"users\":[{\"n\":\"a\",\"on\":true},"
                          "{\"n\":\"b\",\"on\":false}],\"s\":\"h\\u00e9llo\"}";

/* Renders tmpl with MSGS and VARS; checks the output equals want. */
#define R(tmpl, want) check_render(__LINE__, tmpl, want)
static void check_render(int line, const char *tmpl, const char *want) {
    char *got = NULL;
    kiln_status st = kiln_chat_template_render(tmpl, MSGS, NULL, false, "<s>", "</s>", VARS, &got);
    test_checks++;
    if (st != KILN_OK || strcmp(got, want) != 0) {
        test_failures++;
        fprintf(stderr, "test_jinja.c:%d: template %s\n  want: '%s'\n  got:  '%s' %s\n", line, tmpl,
                want, st == KILN_OK ? got : "(error)", st == KILN_OK ? "" : kiln_last_error());
    }
    free(got);
}

/* Rendering tmpl must fail with want status and a message containing needle. */
#define E(tmpl, needle) check_error(__LINE__, tmpl, KILN_ERR_FORMAT, needle)
static void check_error(int line, const char *tmpl, kiln_status want, const char *needle) {
    char *got = NULL;
    kiln_status st = kiln_chat_template_render(tmpl, MSGS, NULL, false, "<s>", "</s>", VARS, &got);
    test_checks++;
    if (st != want || !strstr(kiln_last_error(), needle) || got != NULL) {
        test_failures++;
        fprintf(stderr,
                "test_jinja.c:%d: template %.80s\n  want error containing '%s'\n  got %s: %s\n",
                line, tmpl, needle, kiln_status_name(st), st == KILN_OK ? got : kiln_last_error());
    }
    free(got);
}

static void test_expressions(void) {
    R("{{ 'a' ~ 1 ~ none ~ true }}", "a1NoneTrue");
    R("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % -3 }}|{{ 7 / 2 }}",
      "7|9|3|-4|-2|3.5");
    R("{{ 2 ** 10 }}|{{ 1.0 }}|{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 10 / 4 }}|{{ 3 - 0.5 }}",
      "1024|1.0|0.30000000000000004|1e+20|1.5e-07|2.5|2.5");
    R("{{ 'a\\n\\tb' }}|{{ \"it's\" }}|{{ 'x' 'y' }}|{{ '\\u00e9' }}", "a\n\tb|it's|xy|\xc3\xa9");
    R("{{ [1, 'a', none, true] }}|{{ {'k': 'v'} }}|{{ (1,) }}|{{ (1, 2) }}|{{ [] }}",
      "[1, 'a', None, True]|{'k': 'v'}|(1,)|(1, 2)|[]");
    R("{{ True }}{{ False }}{{ None is none }}{{ true and not false }}", "TrueFalseTrueTrue");
    R("{{ x[1:] }}|{{ x[::-1] }}|{{ x[-2:] }}|{{ x[:-1] }}|{{ x[::2] }}|{{ x[1] }}|{{ x[-1] }}",
      "[2, 3, 4]|[4, 3, 2, 1]|[3, 4]|[1, 2, 3]|[1, 3]|2|4");
    R("{{ 'hello'[1:3] }}|{{ s[::-1] }}|{{ s[1] }}|{{ s|length }}", "el|oll\xc3\xa9h|\xc3\xa9|5");
    R("{{ 1 < 2 < 3 }}{{ 3 < 2 < 4 }}{{ 'a' in 'cat' }}{{ 3 not in x }}{{ 'a' in d }}{{ 2 in x }}",
      "TrueFalseTrueFalseTrueTrue");
    R("{{ 1 == 1.0 }}{{ 'a' != 'b' }}{{ [1, 2] == [1, 2] }}{{ 2 >= 3 }}{{ 'b' > 'a' }}",
      "TrueTrueTrueFalseTrue");
    R("{{ 0 or 'b' }}{{ 1 and 'c' }}{{ not none }}{{ '' or [] or 'z' }}", "bcTruez");
    R("{{ 'y' if x else 'n' }}|{{ 'y' if missing }}|{{ 'a' if false else 'b' if true else 'c' }}",
      "y||b");
    R("{{ missing }}|{{ missing is defined }}|{{ missing|default('d') }}|{{ d.nokey is defined }}",
      "|False|d|False");
    R("{{ ''|default('e', true) }}{{ ''|d('f', boolean=true) }}{{ 0|default(5) }}", "ef0");
    R("{{ messages[0]['content'] }}{{ messages[1].role }}{{ messages|length }}", "Hi!assistant2");
    R("{{ bos_token }}x{{ eos_token }}{{ add_generation_prompt }}{{ tools }}", "<s>x</s>FalseNone");
    R("{{ -3|abs }}{{ -(2) }}{{ +4 }}{{ 1 ~ 2 }}{{ x.0 }}", "3-24121");
    R("{{ {'b': 1, 'a': 2}['a'] }}{{ [[1, 2], [3]][0][1] }}{{ x[10] is undefined }}", "22True");
}

static void test_statements(void) {
    R("{% if x|length > 5 %}a{% elif x|length > 3 %}b{% else %}c{% endif %}", "b");
    R("{% if false %}a{% elif false %}b{% else %}c{% endif %}{% if true %}d{% endif %}", "cd");
    R("{% for i in x[:2] %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
      "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }},{% endfor %}",
      "10TrueFalse221,21FalseTrue210,");
    R("{% for i in x %}{{ loop.previtem|default('-') }}{{ loop.nextitem|default('-') }} {% endfor "
      "%}",
      "-2 13 24 3- ");
    R("{% for i in [] %}x{% else %}empty{% endfor %}|{% for i in x %}{% else %}no{% endfor %}",
      "empty|");
    R("{% for i in x if i is even %}{{ loop.index }}:{{ i }} {% endfor %}", "1:2 2:4 ");
    R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}", "a=1;b=2;");
    R("{% for k in d %}{{ k }}{% endfor %}{% for ch in s %}{{ ch }}.{% endfor %}",
      "ah.\xc3\xa9.l.l.o.");
    R("{% for i in x %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif "
      "%}"
      "{{ i }}{% endfor %}",
      "13");
    R("{% for i in x %}{{ loop.cycle('a', 'b') }}{% endfor %}", "abab");
    R("{% for a in [1, 2] %}{% for b in [3] %}{{ loop.depth }}{{ a }}{{ b }}{% endfor %}{% endfor "
      "%}",
      "213223");
    R("{% for m in messages %}{{ m.role }}:{{ m.content }}{{ '|' if not loop.last }}{% endfor %}",
      "user:Hi!|assistant:Yo");
    R("{% set a = 1 %}{% for i in x %}{% set a = i %}{% endfor %}{{ a }}", "1");
    R("{% set ns = namespace(n=0, last=none) %}{% for i in x %}{% set ns.n = ns.n + i %}"
      "{% set ns.last = i %}{% endfor %}{{ ns.n }}/{{ ns.last }}",
      "10/4");
    R("{% set s2 %}hi {{ 1 }}{% endset %}[{{ s2 }}]{% set u | upper %}abc{% endset %}{{ u }}",
      "[hi 1]ABC");
    R("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = (3, 4) %}{% set c, e = t %}{{ c + e }}",
      "127");
    R("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
      "{{ greet('Bo') }} {{ greet('Al', punct='?') }} {{ greet(name='Cy') }}",
      "Hi Bo! Hi Al? Hi Cy!");
    R("{% macro v() %}{{ varargs|length }}{{ kwargs.k }}{% endmacro %}{{ v(1, 2, k=3) }}", "23");
    R("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}in{% endcall %}", "<in>");
    R("{% macro m() %}{{ caller(5) }}{% endmacro %}{% call(v) m() %}v={{ v }}{% endcall %}", "v=5");
    R("{% filter upper %}abc{{ 'd' }}{% endfilter %}{% filter trim | upper %}  e  {% endfilter %}",
      "ABCDE");
    R("{% set ns = namespace(l=[]) %}{% for i in x %}{% set _ = ns.l.append(i * 2) %}{% endfor %}"
      "{{ ns.l }}",
      "[2, 4, 6, 8]");
    R("{% generation %}g{% endgeneration %}{% do x.append(5) %}{{ x|length }}", "g5");
}

static void test_whitespace(void) {
    R("{% if true %}\n  x\n{% endif %}\n", "  x\n");
    R("a\n    {% if true %}b{% endif %}", "a\nb");
    R("a  {{- 'b' -}}  c", "abc");
    R("{%- if true -%}  x  {%- endif %}", "x");
    R("a\n  {%+ if true %}b{% endif %}", "a\n  b");
    R("a{# c #}b|a\n{# c #}\nb|a {#- c -#} b", "ab|a\nb|ab");
    R("{% raw %}{{ x }}{% if %}{% endraw %}", "{{ x }}{% if %}");
    R("x\n", "x");
    R("x\n\n", "x\n");
    R("a\r\nb", "a\nb");
    R("{{ 'a' }}\n{{ 'b' }}", "a\nb");
    R("{% for i in [1, 2] %}\n  {{ i }}\n{% endfor %}\n", "  1\n  2\n");
    R("  {{ 'x' }}  {% if true %}y{% endif %}", "  x  y");
}

static void test_filters(void) {
    R("{{ {'a': [1, 2.5, none, true, '\\u00e9\"\\n']}|tojson }}",
      "{\"a\": [1, 2.5, null, true, \"\xc3\xa9\\\"\\n\"]}");
    R("{{ {'a': [1], 'b': {}}|tojson(indent=2) }}", "{\n  \"a\": [\n    1\n  ],\n  \"b\": {}\n}");
    R("{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}",
      "{\"a\": 2, \"b\": 1}|[1,2]");
    R("{{ 'x\\u0001'|tojson }}|{{ users|tojson }}",
      "\"x\\u0001\"|[{\"n\": \"a\", \"on\": true}, {\"n\": \"b\", \"on\": false}]");
    R("{{ '  hi  '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 'hELLo'|capitalize }}|{{ 'hello "
      "wOrld-x'|title }}"
      "|{{ 'ab'|upper }}|{{ '\\u00c9A'|lower }}",
      "hi|hi|Hello|Hello World-X|AB|\xc3\xa9"
      "a");
    R("{{ 'a-b-c'|replace('-', '+') }}|{{ 'a-b-c'|replace('-', '', 1) }}|{{ x|join(',') }}|{{ "
      "x|join }}",
      "a+b+c|ab-c|1,2,3,4|1234");
    R("{{ x|first }}{{ x|last }}{{ 'abc'|length }}{{ x|count }}{{ d|length }}{{ 'ab'|first }}",
      "1434"
      "1a");
    R("{{ d|items|list }}|{{ d|list }}|{{ 'ab'|list }}", "[('a', 1)]|['a']|['a', 'b']");
    R("{{ users|selectattr('on')|map(attribute='n')|join }}|{{ "
      "users|rejectattr('on')|map(attribute='n')|list }}"
      "|{{ users|selectattr('n', 'equalto', 'b')|list|length }}|{{ x|select('odd')|list }}"
      "|{{ x|reject('lt', 3)|list }}",
      "a|['b']|1|[1, 3]|[3, 4]");
    R("{{ ['a', 'b']|map('upper')|join }}|{{ users|map(attribute='zz', default='-')|join }}",
      "AB|--");
    R("{{ 'x'|string }}{{ '42'|int + 1 }}{{ '2.5'|float }}{{ 'q'|int }}{{ 3.9|int }}{{ "
      "2.567|round(2) }}"
      "|{{ 2.5|round }}|{{ 2.4|round(method='ceil') }}",
      "x432.503"
      "2.57|2.0|3.0");
    R("{{ [3, 1, 2]|sort }}{{ [3, 1, 2]|sort(reverse=true) }}{{ ['b', 'A', 'a']|unique|list }}"
      "{{ x|reverse|list }}{{ 'abc'|reverse }}",
      "[1, 2, 3][3, 2, 1]['b', 'A'][4, 3, 2, 1]cba");
    R("{{ users|sort(attribute='n', reverse=true)|map(attribute='n')|join }}|{{ ['b', 'A', "
      "'c']|sort }}",
      "ba|['A', 'b', 'c']");
    R("{{ x|batch(3)|list }}|{{ x|batch(3, 0)|list }}", "[[1, 2, 3], [4]]|[[1, 2, 3], [4, 0, 0]]");
    R("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('>', "
      "blank=true) }}",
      "a\n  b\n\n  c|  a\n  b|a\n>\n>b");
    R("[{{ 'ab'|center(6) }}]{{ 'one two  three'|wordcount }}{{ '<a&\">'|e }}{{ '<'|escape }}{{ "
      "'<'|safe }}",
      "[  ab  ]3&lt;a&amp;&#34;&gt;&lt;<");
    R("{{ x|sum }}{{ x|min }}{{ x|max }}{{ {'b': 1, 'a': 2}|dictsort }}{{ '%s-%d'|format('a', 3) "
      "}}",
      "1014[('a', 2), ('b', 1)]a-3");
}

static void test_tests(void) {
    R("{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(2) }}{{ 'a' is "
      "string }}"
      "{{ 1 is number }}{{ 1 is integer }}{{ 1.5 is float }}{{ {} is mapping }}{{ [] is iterable "
      "}}",
      "TrueTrueTrueFalseTrueTrueTrueTrueTrueTrue");
    R("{{ true is boolean }}{{ none is none }}{{ 'A' is upper }}{{ 'a' is lower }}{{ 2 is in [1, "
      "2] }}"
      "{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ false is false }}{{ true is true }}{{ [] is sequence }}",
      "TrueTrueTrueTrueTrueTrueTrueTrueTrueTrue");
    R("{{ 'ab' is startingwith 'a' }}{{ 1 is not none }}{{ 1 is string }}{{ 1.0 is integer }}"
      "{{ true is number }}{{ 1 is equalto 1 }}{{ x is defined and x is not string }}{{ greet is "
      "undefined }}",
      "TrueTrueFalseFalseTrueTrueTrueTrue");
    R("{{ 3 is gt 2 }}{{ 3 is lt 2 }}{{ 3 is ge 3 }}{{ 3 is le 2 }}{{ 1 is sameas 1 }}{{ range is "
      "callable }}",
      "TrueFalseTrueFalseTrueTrue");
}

static void test_methods_and_globals(void) {
    R("{{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '\\n\\nhi\\n'.lstrip('\\n') }}|{{ '  a "
      "'.rstrip() }}.",
      "x|hi|hi\n|  a.");
    R("{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ "
      "'a<t>b'.split('<t>')[-1] }}",
      "['a', 'b', '', 'c']|['a', 'b']|['a', 'b c']|b");
    R("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'abc'.startswith('b') }}",
      "TrueTrueFalse");
    R("{{ 'ab'.upper() }}|{{ 'AB'.lower() }}|{{ 'hello world'.title() }}|{{ 'a-a'.replace('a', "
      "'b') }}"
      "|{{ '{} and {name} {{x}}'.format(1, name='n') }}|{{ 'hi'.capitalize() }}",
      "AB|ab|Hello World|b-b|1 and n {x}|Hi");
    R("{{ ', '.join(['a', 'b']) }}|{{ 'abcb'.find('b') }}|{{ 'abcb'.count('b') }}|{{ "
      "'12'.isdigit() }}",
      "a, b|1|2|True");
    R("{{ d.get('a') }}{{ d.get('zz', 'no') }}{{ d.get('zz') }}{{ d.keys()|list }}{{ "
      "d.values()|list }}"
      "{{ d.items()|list }}",
      "1noNone['a'][1][('a', 1)]");
    R("{{ range(3)|list }}{{ range(1, 7, 2)|list }}{{ range(3, 0, -1)|list }}{{ range(0)|list }}",
      "[0, 1, 2][1, 3, 5][3, 2, 1][]");
    R("{% set dd = dict(a=1, b='x') %}{{ dd.b }}{{ dd|length }}", "x2");
    R("{%- if not date_string is defined %}{%- set date_string = 'fallback' %}{%- endif %}"
      "Today Date: {{ date_string }}",
      "Today Date: fallback");
    /* strftime_now with a fixed date (KILN_CHAT_DATE), and date_string injected via kwargs. */
    setenv("KILN_CHAT_DATE", "2024-07-26", 1);
    R("{{ strftime_now('%d %b %Y') }}|{{ strftime_now('%Y-%m-%d %A') }}",
      "26 Jul 2024|2024-07-26 Friday");
    unsetenv("KILN_CHAT_DATE");
    char *got = NULL;
    CHECK_OK(kiln_chat_template_render(
        "{%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}"
        "{%- endif %}Today Date: {{ date_string }}",
        "[]", NULL, false, NULL, NULL, "{\"date_string\": \"01 Jan 2030\"}", &got));
    CHECK(got && !strcmp(got, "Today Date: 01 Jan 2030"));
    free(got);
    /* tools given separately, add_generation_prompt true. */
    got = NULL;
    CHECK_OK(kiln_chat_template_render(
        "{{ tools|length }}{{ tools[0].name }}{{ add_generation_prompt }}", "[]",
        "[{\"name\":\"f\"}]", true, NULL, NULL, NULL, &got));
    CHECK(got && !strcmp(got, "1fTrue"));
    free(got);
}

static void test_errors(void) {
    E("line 1\n{{ x|foo }}", "chat template line 2: unknown filter 'foo'");
    E("{{ x is foo }}", "chat template line 1: unknown test 'foo'");
    E("a\n{% if true %}x", "'if' block opened on line 2 is not closed (expected 'endif')");
    E("{% for i in x %}\n{% if true %}{% endfor %}",
      "line 2: unexpected 'endfor' inside 'if' block");
    E("{% for i in x %}", "expected 'endfor'");
    E("{% endfor %}", "line 1: unexpected 'endfor'");
    E("{% macro m() %}", "expected 'endmacro'");
    E("a\nb\n{{ 1 + }}", "chat template line 3: syntax error");
    E("{{ 'abc }}", "unterminated string");
    E("{{ x ", "unexpected end of template");
    E("{# x", "unclosed comment");
    E("{% raw %}x", "unclosed raw block");
    E("{{ a b }}", "syntax error: unexpected 'b'");
    E("{% if %}{% endif %}", "syntax error");
    E("{{ x[ }}", "unexpected end of template");
    E("{{ f(a=1, 2) }}", "positional argument follows keyword argument");
    E("{% include 'x' %}", "unknown tag 'include'");
    E("{% for i in x recursive %}{% endfor %}", "recursive for loops are not supported");
    E("\n{{ raise_exception('Bad role') }}", "chat template line 2: raise_exception: Bad role");
    E("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "recursion too deep");
    E("{% set r = range(1000000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
      "takes too long");
    E("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "output exceeds the size limit");
    E("{{ 'x' * 100000000 }}", "repetition too large");
    E("{{ range(10000000) }}", "range too large");
    E("{{ 2 ** 64 }}", "integer overflow");
    E("{{ 1 // 0 }}", "division or modulo by zero");
    E("{{ 1 / 0 }}", "division by zero");
    E("a\n\n{{ 1 + 'x' }}", "line 3: unsupported operand type(s) for +: 'int' and 'str'");
    E("{{ nope.x }}", "'nope' is undefined");
    E("{{ nope + 1 }}", "'nope' is undefined");
    E("{{ nope() }}", "'nope' is undefined");
    E("{{ x() }}", "'list' object is not callable");
    E("{% set dd = {} %}{% set dd.x = 1 %}", "cannot assign attribute on non-namespace object");
    E("{% break %}", "outside of a loop");
    E("{% for a, b in x %}{% endfor %}", "cannot unpack");
    E("{% for i in 5 %}{% endfor %}", "'int' object is not iterable");
    E("{{ 1 < 'a' }}", "'<' not supported");
    E("{{ 5 is divisibleby 0 }}", "division or modulo by zero");
    E("{{ [1]|tojson(indent=1000) }}", "indent too large");
    E("{{ missing|tojson }}", "not JSON serializable");
    E("{{ 'x'.nosuch() }}", "'str' object has no attribute 'nosuch'");
    E("{{ 99999999999999999999 }}", "integer literal too large");
    E("{{ '\\xZZ' }}", "bad \\x escape");
    E("{{ @ }}", "unexpected character '@'");
    /* A deeply nested expression hits the parser's depth cap, not the C stack. */
    char deep[4200];
    strcpy(deep, "{{ ");
    for (int i = 0; i < 2000; i++) strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 2000; i++) strcat(deep, ")");
    strcat(deep, " }}");
    E(deep, "nested too deeply");
    char deep2[20000] = "";
    for (int i = 0; i < 1000; i++) strcat(deep2, "{% if true %}");
    E(deep2, "nested too deeply");

    /* Bad inputs. */
    char *out = NULL;
    CHECK_ERR(kiln_chat_template_render("x", "[", NULL, false, NULL, NULL, NULL, &out),
              KILN_ERR_FORMAT, "messages is not valid JSON");
    CHECK(out == NULL);
    CHECK_ERR(kiln_chat_template_render("x", "{}", NULL, false, NULL, NULL, NULL, &out),
              KILN_ERR_FORMAT, "messages must be a JSON array");
    CHECK_ERR(kiln_chat_template_render("x", "[]", "{}", false, NULL, NULL, NULL, &out),
              KILN_ERR_FORMAT, "tools must be a JSON array");
    CHECK_ERR(kiln_chat_template_render("x", "[]", NULL, false, NULL, NULL, "[1]", &out),
              KILN_ERR_FORMAT, "kwargs must be a JSON object");
    CHECK_ERR(kiln_chat_template_render(NULL, "[]", NULL, false, NULL, NULL, NULL, &out),
              KILN_ERR_INVALID_ARG, "no template");
    CHECK_ERR(kiln_chat_template_render("x", NULL, NULL, false, NULL, NULL, NULL, &out),
              KILN_ERR_INVALID_ARG, "no messages");
    CHECK_ERR(kiln_chat_template_render("x", "[]", NULL, false, NULL, NULL, NULL, NULL),
              KILN_ERR_INVALID_ARG, "out is NULL");
}

int main(void) {
    test_expressions();
    test_statements();
    test_whitespace();
    test_filters();
    test_tests();
    test_methods_and_globals();
    test_errors();
    return test_finish();
}
