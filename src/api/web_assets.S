/* The dashboard's files (web/), embedded in the binary at build time (api/web.c serves them).
 * Each is NUL-terminated, between wr_web_NAME and wr_web_NAME_end. */
#define ASSET(sym, file)                                                                          \
    .section .rodata;                                                                             \
    .global sym;                                                                                  \
    .balign 16;                                                                                   \
    sym:                                                                                          \
    .incbin file;                                                                                 \
    .global sym##_end;                                                                            \
    sym##_end:                                                                                    \
    .byte 0

ASSET(wr_web_index_html, "web/index.html")
ASSET(wr_web_app_js, "web/app.js")
ASSET(wr_web_term_js, "web/term.js")
ASSET(wr_web_app_css, "web/app.css")
ASSET(wr_web_icon_svg, "web/icon.svg")

    .section .note.GNU-stack, "", @progbits
