/*
 * The dashboard's files at / (web/ in the source tree, embedded by api/web_assets.S): no key
 * needed, since they hold no data (the page's script asks /v1 for everything, with the key
 * the user types), but the Host and Origin checks hold as for the API. Strict headers: the
 * page runs only its own script and style, in no frame, and sends no Referer.
 */
#include <string.h>

#include "api/api.h"
#include "api/door.h"
#include "common/util.h"

extern const char wr_web_index_html[], wr_web_index_html_end[];
extern const char wr_web_app_js[], wr_web_app_js_end[];
extern const char wr_web_term_js[], wr_web_term_js_end[];
extern const char wr_web_app_css[], wr_web_app_css_end[];
extern const char wr_web_icon_svg[], wr_web_icon_svg_end[];

static const struct asset {
    const char *path;
    const char *type;
    const char *start, *end;
} assets[] = {
    {"/", "text/html; charset=utf-8", wr_web_index_html, wr_web_index_html_end},
    {"/app.js", "text/javascript; charset=utf-8", wr_web_app_js, wr_web_app_js_end},
    {"/term.js", "text/javascript; charset=utf-8", wr_web_term_js, wr_web_term_js_end},
    {"/app.css", "text/css; charset=utf-8", wr_web_app_css, wr_web_app_css_end},
    {"/icon.svg", "image/svg+xml", wr_web_icon_svg, wr_web_icon_svg_end},
};

int api_web_is_asset(const char *method, const char *path)
{
    if (method && strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return 0;
    for (size_t i = 0; i < WR_ARRAY_LEN(assets); i++)
        if (strcmp(path, assets[i].path) == 0)
            return 1;
    return 0;
}

void api_web_serve(struct daemon *d, struct http_req *req)
{
    if (door_meant_for_us(d, req) < 0)
        return;
    const char *path = http_req_path(req);
    for (size_t i = 0; i < WR_ARRAY_LEN(assets); i++) {
        const struct asset *a = &assets[i];
        if (strcmp(path, a->path) != 0)
            continue;
        http_reply_header(req, "Content-Security-Policy",
                          "default-src 'self'; img-src 'self' blob: data:; frame-ancestors 'none'; "
                          "base-uri 'none'; form-action 'none'; object-src 'none'");
        http_reply_header(req, "X-Content-Type-Options", "nosniff");
        http_reply_header(req, "X-Frame-Options", "DENY");
        http_reply_header(req, "Referrer-Policy", "no-referrer");
        http_reply_header(req, "Cross-Origin-Opener-Policy", "same-origin");
        http_reply_header(req, "Cross-Origin-Resource-Policy", "same-origin");
        /* Revalidated each time (the ETag makes that a 304): a new daemon serves a new page. */
        http_reply_header(req, "Cache-Control", "no-cache");
        http_reply(req, 200, a->type, a->start, (size_t)(a->end - a->start));
        return;
    }
    http_reply_error(req, 404, "not_found", "no such file: %.200s", path);
}
