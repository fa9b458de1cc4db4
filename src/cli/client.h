/*
 * A small blocking HTTP/1.1 client for talking to the daemon: one request per connection
 * (Connection: close), over a Unix socket, TCP or TLS (the server's certificate checked against
 * the system's CAs or a CA file, and its name against the URL's host), with the body sent from
 * memory or streamed from a file descriptor, and the answer either buffered or handed to a callback
 * as it arrives (streamed exec output, file downloads). Parsing lives in wire.c; this file does the
 * I/O.
 */
#ifndef WR_CLI_CLIENT_H
#define WR_CLI_CLIENT_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cli/wire.h"
#include "common/err.h"

/* The version reported by `withruntime version` and in User-Agent, unless the build sets it. */
#ifndef WR_VERSION
#define WR_VERSION "0.1.0"
#endif

/* Default cap on a buffered response body. */
#define CLI_BODY_MAX (64 * 1024 * 1024)

/* err->code of a request that the daemon answered with a non-2xx status. */
#define CLI_EAPI EREMOTEIO

/** A daemon to talk to: where, and with which key. */
struct cli_endpoint {
    struct cli_url url;
    char key[512];      /* API key for "Authorization: Bearer", "" for none */
    char desc[300];     /* the URL as given, for messages */
    char ca_file[4096]; /* https: trust only the CAs in this PEM file; "": the system's */
};

/** One request. Zero-initialise, then set what applies. */
struct cli_request {
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* "/v1/..." including an escaped query; the URL's prefix goes first */
    const char *content_type; /* NULL: no Content-Type header */
    const void *body;         /* body from memory (body_fd < 0) */
    size_t body_len;          /* bytes of body, from memory or from body_fd */
    int body_fd;              /* >= 0: stream body_len bytes read from this fd (not closed) */
    int timeout_ms;           /* > 0: give up when the daemon is silent this long; else 10 s
                                 to connect and no limit after */
    bool cancelable;          /* a stop signal (see cli_signals_setup) aborts the request */
    cli_data_fn on_data;      /* a 2xx body goes here as it arrives; NULL: buffer it */
    void *ctx;                /* for on_data */
    size_t max_body;          /* cap on a buffered 2xx body; 0: CLI_BODY_MAX */
};

/** What came back. Free with cli_response_free. */
struct cli_response {
    int status;             /* 0 when no response head arrived */
    char reason[64];        /* reason phrase */
    char content_type[128]; /* Content-Type, "" when absent */
    char error_code[64];    /* the envelope's error.code on a non-2xx answer, else "" */
    char *body;             /* buffered body, NUL-terminated (owned); NULL when streamed */
    size_t body_len;
    bool local_error; /* the request failed on our side: on_data failed (our stdout, say) */
};

/** Initialises a request: zeroes it and sets body_fd to -1. */
void cli_request_init(struct cli_request *req, const char *method, const char *path);

/**
 * Sends req to the daemon at ep and reads the answer into resp. Returns 0 on a 2xx answer;
 * -1 with err set otherwise: a transport or protocol failure (resp->status 0, err->code an errno
 * value; ECANCELED when a stop signal interrupted a cancelable request; EPERM, before anything is
 * sent or connected, when ep has a key and a plain http:// URL to a host that is not loopback,
 * see cli_url_key_safe; EPROTO for a failed TLS handshake or certificate), or a non-2xx answer
 * (resp->status set, err->code CLI_EAPI, err->msg the daemon's message from the error envelope).
 * err->kind says which, for cli_exit_code: WR_E_NOT_FOUND (404), WR_E_INVALID (another 4xx) or
 * WR_E_UNAVAILABLE (5xx) for an answer; WR_E_UNAVAILABLE for a connection that failed;
 * WR_E_INTERNAL for our own side's failure (resp->local_error: on_data failed; EPERM; ECANCELED).
 * The caller frees resp in every case.
 */
int cli_request_do(const struct cli_endpoint *ep, const struct cli_request *req,
                   struct cli_response *resp /* OUT */, struct wr_err *err);

/** Frees what resp owns and zeroes it. */
void cli_response_free(struct cli_response *resp);

/**
 * Makes a JSON call: body (may be NULL; not stolen) is sent as application/json, and a 2xx
 * answer's body is parsed into *out (new reference, caller decrefs; out may be NULL to ignore
 * it). Returns 0, or -1 with err set (err->code CLI_EAPI for a daemon's error answer).
 */
int cli_json_call(const struct cli_endpoint *ep, const char *method, const char *path, json_t *body,
                  json_t **out, struct wr_err *err);

/** The stop signal (SIGINT, SIGTERM, SIGHUP) received since cli_signals_setup, or 0. */
/* ---- a raw connection (a WebSocket after its handshake: cli/shell.c) ---- */

struct cli_conn;

/**
 * Connects to the daemon (TCP, the Unix socket, TLS as the URL says; the key is refused in
 * clear text off loopback as for requests). Returns the connection, or NULL with err set.
 */
struct cli_conn *cli_conn_open(const struct cli_endpoint *ep, struct wr_err *err);
/** The socket, to poll (with cli_conn_buffered: TLS may hold bytes already read). */
int cli_conn_fd(const struct cli_conn *c);
/** Bytes already decrypted and waiting (TLS), readable without the socket. */
size_t cli_conn_buffered(const struct cli_conn *c);
/** Sends all of p[n] (waiting as needed). Returns 0, or -1 with err set. */
int cli_conn_send(struct cli_conn *c, const void *p, size_t n, struct wr_err *err);
/** Reads what is there, waiting for something. Bytes read, 0 at the end, -1 with err set. */
ssize_t cli_conn_recv(struct cli_conn *c, void *buf, size_t cap, struct wr_err *err);
/** The Host header's value for the endpoint, into out[len]. */
void cli_conn_host(const struct cli_endpoint *ep, char *out, size_t len);
/** Closes and frees the connection. */
void cli_conn_close(struct cli_conn *c);

extern volatile sig_atomic_t cli_stop_signal;

/**
 * For commands that must clean up when stopped (sandbox run/exec): installs handlers that record
 * SIGINT, SIGTERM and SIGHUP in cli_stop_signal and keeps those signals blocked except while a
 * cancelable request waits on the daemon, so a stop can never fall between a check and a wait.
 * Also ignores SIGPIPE (write errors are handled where they happen).
 */
void cli_signals_setup(void);

/** Lets a stop signal that arrived while blocked be recorded; returns cli_stop_signal. */
int cli_signals_poll(void);

/** The signal mask to give a child process (the one in force before cli_signals_setup). */
void cli_signals_child_reset(void);

#endif
