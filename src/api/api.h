/*
 * The /v1 API: one handler per route, a file per resource. Handlers run on
 * the loop thread and answer each request exactly once.
 */
#ifndef WR_API_H
#define WR_API_H

#include <jansson.h>

#include "daemon/daemon.h"
#include "http/http.h"
#include "http/router.h"

/** The HTTP server's request handler; ctx is the struct daemon. */
void api_handle(struct http_req *req, void *ctx);

/**
 * Reads the request body as a JSON object, enforcing the JSON size limit. On failure answers
 * (400 or 413) and returns NULL. An empty body counts as {} when empty_ok.
 */
json_t *api_json_body(struct daemon *d, struct http_req *req, int empty_ok);

/**
 * Reads query parameter name as a non-negative decimal integer into *out (def when absent).
 * On a malformed value answers 400 naming the parameter and returns -1.
 */
int api_query_u64(struct http_req *req, const char *name, uint64_t def, uint64_t *out);

/** Finds the sandbox named in the path, or answers 404 and returns NULL. */
struct sandbox *api_sandbox(struct daemon *d, struct http_req *req, const char *id);

/** Like api_sandbox, but also answers 409 unless the sandbox is running with a live agent. */
struct sandbox *api_sandbox_running(struct daemon *d, struct http_req *req, const char *id);

/* Handlers, by resource. */
void api_sandboxes_create(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_delete(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_stop(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_start(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_timeout(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_events(struct daemon *d, struct http_req *req, struct route_match *m);
void api_exec(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_read(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_write(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_stat(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_mkdir(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_remove(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_output(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_wait(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_signal(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_stats(struct daemon *d, struct http_req *req, struct route_match *m);
void api_health(struct daemon *d, struct http_req *req, struct route_match *m);
void api_images_list(struct daemon *d, struct http_req *req, struct route_match *m);

#endif
