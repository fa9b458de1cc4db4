/*
 * /v1/sandboxes/{id}/commands: background commands started with
 * `exec {"background": true}` — list, get, read output from an offset,
 * wait, signal. The service (daemon/command.c) keeps them.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "api/api.h"
#include "api/jsonv.h"
#include "common/util.h"
#include "daemon/daemon.h"
#include "daemon/service.h"

void api_commands_list(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_command_list(d, m->params[0], api_sink_new(req));
}

void api_commands_get(struct daemon *d, struct http_req *req, struct route_match *m)
{
    svc_command_get(d, m->params[0], m->params[1], api_sink_new(req));
}

void api_commands_output(struct daemon *d, struct http_req *req, struct route_match *m)
{
    uint64_t off[2];
    if (api_query_u64(req, "stdout_offset", 0, &off[0]) < 0 ||
        api_query_u64(req, "stderr_offset", 0, &off[1]) < 0)
        return;
    svc_command_output(d, m->params[0], m->params[1], off[0], off[1], api_sink_new(req));
}

static const char *const wait_fields[] = {"timeout_seconds", NULL};

void api_commands_wait(struct daemon *d, struct http_req *req, struct route_match *m)
{
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    struct wr_err err = {0};
    double t;
    if (jv_only(o, wait_fields, &err) < 0 ||
        jv_number(o, "timeout_seconds", 0, 3600, 30, &t, &err) < 0) {
        json_decref(o);
        api_reply_err(req, &err);
        return;
    }
    json_decref(o);
    svc_command_wait(d, m->params[0], m->params[1], t, api_sink_new(req));
}

static const char *const signal_fields[] = {"signal", NULL};

int api_signal_number(json_t *v)
{
    static const struct {
        const char *name;
        int num;
    } names[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},
                 {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"USR1", SIGUSR1},
                 {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
    if (!v)
        return SIGTERM;
    if (json_is_number(v)) {
        double n = json_number_value(v);
        return n >= 1 && n <= 64 && n == (int)n ? (int)n : -1;
    }
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
    json_t *o = api_json_body(d, req, 1);
    if (!o)
        return;
    struct wr_err err = {0};
    int sig = api_signal_number(json_object_get(o, "signal"));
    int bad = jv_only(o, signal_fields, &err) < 0;
    json_decref(o);
    if (bad) {
        api_reply_err(req, &err);
        return;
    }
    if (sig < 0) {
        api_reply_invalid(req, "signal: must be a number from 1 to 64 or a name like \"TERM\"");
        return;
    }
    svc_command_signal(d, m->params[0], m->params[1], sig, api_sink_new(req));
}
