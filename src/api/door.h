/*
 * The door (api/door.c): the checks every request passes before its route sees it: that it
 * is meant for this daemon (Host, Origin), who it is from (a key, or root on the Unix socket),
 * and that its client is not failing over and over.
 */
#ifndef WR_API_DOOR_H
#define WR_API_DOOR_H

#include "http/http.h"

struct daemon;
struct principal;

/**
 * Lets req in (0, with who filled) or answers it (-1: 400, 401, 403 or 429; req is then
 * freed).
 */
int door_check(struct daemon *d, struct http_req *req, struct principal *who);

/**
 * The first half of door_check, for what needs no key (the dashboard's files): the Host and
 * Origin checks. 0 if they pass; -1 after answering 400 or 403.
 */
int door_meant_for_us(struct daemon *d, struct http_req *req);

/**
 * Returns 1 if req's body may be read as JSON: it says Content-Type: application/json, or it
 * has no body and no Content-Type. (A browser's cross-site form posts text/plain.)
 */
int door_content_type_ok(struct http_req *req);

#endif
