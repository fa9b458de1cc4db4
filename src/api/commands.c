/*
 * /v1/sandboxes/{id}/commands: background commands started with
 * `exec {"background": true}` — list, get, read output from an offset,
 * wait, signal.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/base64.h"
#include "common/util.h"
#include "daemon/command.h"
#include "daemon/sandbox.h"

static struct command *find(struct daemon *d, struct http_req *req, struct route_match *m,
                            struct sandbox **sbp)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return NULL;
    struct command *c = command_find(sb, m->params[1]);
    if (!c)
        http_reply_error(req, 404, "not_found", "command %.64s not found in sandbox %s",
                         m->params[1], sb->id);
    if (sbp)
        *sbp = sb;
    return c;
}

void api_commands_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct sandbox *sb = api_sandbox(d, req, m->params[0]);
    if (!sb)
        return;
    json_t *arr = json_array();
    for (struct command *c = sb->commands; c; c = c->next)
        json_array_insert_new(arr, 0, command_to_json(c));
    http_reply_json(req, 200, json_pack("{s:o}", "commands", arr));
}

void api_commands_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct command *c = find(d, req, m, NULL);
    if (c)
        http_reply_json(req, 200, command_to_json(c));
}

void api_commands_output(struct daemon *d, struct http_req *req, struct route_match *m)
{
    uint64_t off[2];
    if (api_query_u64(req, "stdout_offset", 0, &off[0]) < 0 ||
        api_query_u64(req, "stderr_offset", 0, &off[1]) < 0)
        return;
    struct command *c = find(d, req, m, NULL);
    if (!c)
        return;
    json_t *o = command_to_json(c);
    static const char *names[2] = {"stdout", "stderr"};
    for (int i = 0; i < 2; i++) {
        const struct command_out *out = &c->out[i];
        size_t from = off[i] < out->len ? off[i] : out->len;
        const unsigned char *p = out->data ? out->data + from : (const unsigned char *)"";
        size_t n = out->len - from;
        char key[32];
        if (jv_utf8_valid(p, n)) {
            json_object_set_new(o, names[i], json_stringn((const char *)p, n));
            snprintf(key, sizeof(key), "%s_encoding", names[i]);
            json_object_set_new(o, key, json_string("utf-8"));
        } else {
            char *b64 = base64_encode(p, n);
            json_object_set_new(o, names[i], json_string(b64));
            free(b64);
            snprintf(key, sizeof(key), "%s_encoding", names[i]);
            json_object_set_new(o, key, json_string("base64"));
        }
        snprintf(key, sizeof(key), "%s_next_offset", names[i]);
        json_object_set_new(o, key, json_integer((json_int_t)out->len));
    }
    http_reply_json(req, 200, o);
}

static const char *const wait_fields[] = {"timeout_seconds", NULL};

void api_commands_wait(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct command *c = find(d, req, m, NULL);
    if (!c)
        return;
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    char msg[JV_MSG];
    double t;
    if (jv_only(o, wait_fields, msg) < 0 ||
        jv_number(o, "timeout_seconds", 0, 3600, 30, &t, msg) < 0) {
        json_decref(o);
        http_reply_error(req, 400, "invalid_request", "%s", msg);
        return;
    }
    json_decref(o);
    command_wait(c, req, t);
}

static const char *const signal_fields[] = {"signal", NULL};

static int signal_number(json_t *v)
{
    static const struct {
        const char *name;
        int num;
    } names[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},
                 {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
                 {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
    if (!v)
        return SIGTERM;
    if (json_is_integer(v))
        return json_integer_value(v) >= 1 && json_integer_value(v) <= 64
                   ? (int)json_integer_value(v)
                   : -1;
    if (!json_is_string(v))
        return -1;
    const char *s = json_string_value(v);
    if (strncmp(s, "SIG", 3) == 0)
        s += 3;
    for (size_t i = 0; i < WR_ARRAY_LEN(names); i++)
        if (strcmp(s, names[i].name) == 0)
            return names[i].num;
    return -1;
}

void api_commands_signal(struct daemon *d, struct http_req *req, struct route_match *m)
{
    struct command *c = find(d, req, m, NULL);
    if (!c)
        return;
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    char msg[JV_MSG];
    int sig = signal_number(json_object_get(o, "signal"));
    int bad = jv_only(o, signal_fields, msg) < 0;
    json_decref(o);
    if (bad || sig < 0) {
        http_reply_error(req, 400, "invalid_request", "%s",
                         bad ? msg
                             : "signal: must be a number from 1 to 64 or a name like \"TERM\"");
        return;
    }
    if (command_signal(c, sig) < 0) {
        http_reply_error(req, 409, "conflict", "command %s is not running", c->id);
        return;
    }
    http_reply_json(req, 200, command_to_json(c));
}
