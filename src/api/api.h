/*
 * The /v1 API: one handler per route, a file per resource. A handler reads
 * and checks its request, calls the service (daemon/service.h) with a sink
 * that turns the service's answer into HTTP (api/sink.c), and returns. It
 * knows nothing of sandboxes' insides, agent frames or drivers.
 */
#ifndef WR_API_H
#define WR_API_H

#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "common/err.h"
#include "http/http.h"
#include "http/router.h"

struct daemon;
struct principal;
struct sink;

/** The HTTP server's request handler; ctx is the struct daemon. */
void api_handle(struct http_req *req, void *ctx);

/**
 * `withruntime serve [flags]`: opens the daemon, serves the API on its listeners until
 * SIGTERM/SIGINT, then shuts the daemon down. argv[0] is "serve". Returns the exit status.
 */
int api_serve_main(int argc, char **argv);

/** Prints `withruntime serve --help` to out. */
void api_serve_usage(FILE *out);

/** serve's long options (getopt_long's table, ending with a zeroed entry). */
extern const struct option api_serve_options[];

/**
 * A sink (daemon/sink.h) answering req: the service's replies become JSON bodies, its
 * failures the error envelope with the status for their kind, its streams chunked bodies
 * (record streams as NDJSON). The sink frees itself once the answer is finished.
 */
struct sink *api_sink_new(struct http_req *req);

/** Who req is from, as the door (api/door.c) found; NULL before the door let it in. */
const struct principal *api_req_who(struct http_req *req);

/** Notes the sandbox a request made (a create), for the audit trail. */
void api_req_note_sandbox(struct http_req *req, const char *id);

/** The HTTP server's reply hook (ctx: the daemon): mutating requests go to the audit trail. */
void api_reply_hook(struct http_req *req, int status, void *ctx);

/** Answers req with the error envelope for err (status and code from its kind). Frees req. */
void api_reply_err(struct http_req *req, const struct wr_err *err);

/**
 * Reads the request body as a JSON object, enforcing the JSON size limit. On failure answers
 * (400 or 413) and returns NULL. An empty body counts as {} when empty_ok.
 */
/** The body limit of a route (http_body_limit_fn; ctx is the daemon): the upload limit for a
 * file upload, the JSON limit for everything else. */
size_t api_body_limit(const char *method, const char *target, void *ctx);

json_t *api_json_body(struct daemon *d, struct http_req *req, int empty_ok);

/**
 * Reads query parameter name as a non-negative decimal integer into *out (def when absent).
 * On a malformed value answers 400 naming the parameter and returns -1.
 */
int api_query_u64(struct http_req *req, const char *name, uint64_t def, uint64_t *out);

/** Answers 400 invalid_request with msg. Frees req. */
void api_reply_invalid(struct http_req *req, const char *msg);

/** A signal given as a name ("INT", "SIGINT") or a number 1..64; NULL: SIGTERM. -1: neither. */
int api_signal_number(json_t *v);

/** Returns 1 if method and path ask for one of the dashboard's files (api/web.c); a NULL
 * method: if path is one, whatever the method. */
int api_web_is_asset(const char *method, const char *path);

/** Answers a request for one of the dashboard's files (no key needed; Host and Origin
 * checked). Frees req. */
void api_web_serve(struct daemon *d, struct http_req *req);

/* Handlers, by resource. */
void api_sessions_create(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sessions_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sessions_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sessions_delete(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sessions_connect(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_create(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_delete(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_stop(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_start(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_timeout(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_network(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_network_log(struct daemon *d, struct http_req *req, struct route_match *m);
void api_secrets_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_secrets_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_secrets_set(struct daemon *d, struct http_req *req, struct route_match *m);
void api_secrets_update(struct daemon *d, struct http_req *req, struct route_match *m);
void api_secrets_delete(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_events(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_stats(struct daemon *d, struct http_req *req, struct route_match *m);
void api_sandboxes_prune(struct daemon *d, struct http_req *req, struct route_match *m);
void api_exec(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_read(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_write(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_stat(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_mkdir(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_remove(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_archive(struct daemon *d, struct http_req *req, struct route_match *m);
void api_files_extract(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_output(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_wait(struct daemon *d, struct http_req *req, struct route_match *m);
void api_commands_signal(struct daemon *d, struct http_req *req, struct route_match *m);
void api_health(struct daemon *d, struct http_req *req, struct route_match *m);
void api_images_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_keys_create(struct daemon *d, struct http_req *req, struct route_match *m);
void api_keys_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_keys_get(struct daemon *d, struct http_req *req, struct route_match *m);
void api_keys_update(struct daemon *d, struct http_req *req, struct route_match *m);
void api_keys_revoke(struct daemon *d, struct http_req *req, struct route_match *m);
void api_audit_list(struct daemon *d, struct http_req *req, struct route_match *m);
void api_usage(struct daemon *d, struct http_req *req, struct route_match *m);
void api_whoami(struct daemon *d, struct http_req *req, struct route_match *m);
void api_metrics(struct daemon *d, struct http_req *req, struct route_match *m);

#endif
