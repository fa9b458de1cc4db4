/*
 * What the CLI shows (cli/show.c): control characters, C1 controls and bytes that are not
 * UTF-8 come out as visible escapes; printable text and valid UTF-8 come out as they are.
 */
#include <string.h>

#include "cli/cli.h"
#include "tap.h"

int main(void)
{
    ok(!strcmp(cli_safe("plain name.txt"), "plain name.txt"), "plain text is as it is");
    ok(!strcmp(cli_safe("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
               "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
       "UTF-8 letters, symbols and emoji are as they are");
    ok(!strcmp(cli_safe("a\x1b]0;t\x07\x1b[2J\r\n\tz\x7f"),
               "a\\x1b]0;t\\x07\\x1b[2J\\r\\n\\tz\\x7f"),
       "ESC, BEL, CR, LF, TAB, DEL are escaped: %s", cli_safe("a\x1b]0;t\x07\x1b[2J\r\n\tz\x7f"));
    ok(!strcmp(cli_safe("x\xc2\x9b"
                        "31m\xc2\x85y"),
               "x\\u009b31m\\u0085y"),
       "C1 controls (a CSI of one character) are escaped");
    ok(!strcmp(cli_safe("\xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xc0\xaf"),
               "\\xff\\xfe \\xc3 \\xe2\\x82 \\xed\\xa0\\x80 \\xc0\\xaf"),
       "bytes that are not UTF-8 (cut, surrogate, overlong) are escaped one by one: %s",
       cli_safe("\xff\xfe \xc3 \xe2\x82 \xed\xa0\x80 \xc0\xaf"));
    const char *a = cli_safe("one\x1b"), *b = cli_safe("two\x1b");
    ok(!strcmp(a, "one\\x1b") && !strcmp(b, "two\\x1b"), "two at once, as one printf shows them");
    char small[8];
    ok(cli_escape("\x1b\x1b\x1b", small, sizeof(small)) == 12 && !strcmp(small, "\\x1b"),
       "a short buffer holds whole escapes only; the length needed is returned");
    ok(cli_safe(NULL) == NULL, "NULL stays NULL");
    return tap_done();
}
