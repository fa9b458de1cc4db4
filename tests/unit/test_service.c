/*
 * The service (daemon/service.h) driven through a sink of the test's own, with no HTTP at
 * all: what the API relies on — every operation answers its sink exactly once, with the
 * right kind of error for an unknown sandbox or command and for a bad path — holds without
 * the HTTP layer, which is what keeping the layers apart is for.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "daemon/service.h"
#include "daemon/sink.h"
#include "daemon/work.h"
#include "driver/driver.h"
#include "store/store.h"
#include "tap.h"

struct test_sink {
    struct sink base;
    int answers; /* reply, fail or end: must end at exactly 1 */
    int status;  /* SINK_OK / SINK_CREATED, or -1 after a failure */
    json_t *obj;
    struct wr_err err;
};

static void t_reply(struct sink *s, enum sink_status st, json_t *obj)
{
    struct test_sink *t = (struct test_sink *)s;
    t->answers++;
    t->status = (int)st;
    json_decref(t->obj);
    t->obj = obj;
}

static void t_fail(struct sink *s, const struct wr_err *err)
{
    struct test_sink *t = (struct test_sink *)s;
    t->answers++;
    t->status = -1;
    t->err = *err;
}

static void t_begin(struct sink *s, const char *content_type)
{
}

static void t_write(struct sink *s, const void *data, size_t len)
{
}

static void t_record(struct sink *s, json_t *obj)
{
    json_decref(obj);
}

static void t_end(struct sink *s)
{
    ((struct test_sink *)s)->answers++;
}

static void t_on_cancel(struct sink *s, void (*cb)(void *arg), void *arg)
{
}

static size_t t_input_len(struct sink *s)
{
    return 0;
}

static size_t t_input_read(struct sink *s, void *buf, size_t n)
{
    return 0;
}

static const struct sink_ops test_sink_ops = {
    .reply = t_reply,
    .fail = t_fail,
    .begin = t_begin,
    .write = t_write,
    .record = t_record,
    .end = t_end,
    .on_cancel = t_on_cancel,
    .input_len = t_input_len,
    .input_read = t_input_read,
};

static void sink_init(struct test_sink *t)
{
    json_decref(t->obj);
    memset(t, 0, sizeof(*t));
    t->base.ops = &test_sink_ops;
}

#define MISSING "sb-aaaaaaaaaaaaaaaaaaaaa"

int main(void)
{
    char dir[] = "/tmp/wr-test-service-XXXXXX";
    if (!mkdtemp(dir))
        return 1;
    char db[sizeof(dir) + 16];
    snprintf(db, sizeof(db), "%s/state.db", dir);
    struct daemon d;
    memset(&d, 0, sizeof(d));
    daemon_config_defaults(&d.cfg);
    snprintf(d.cfg.state_dir, sizeof(d.cfg.state_dir), "%s", dir);
    struct wr_err err = {0};
    d.store = store_open(db, &err);
    d.driver = driver_find("fake");
    d.base = event_base_new();
    ok(d.store && d.driver && d.base, "a daemon context without listeners: %s", err.msg);

    struct test_sink t = {0};
    sink_init(&t);
    svc_sandbox_list(&d, NULL, &t.base);
    ok(t.answers == 1 && t.status == SINK_OK &&
           json_array_size(json_object_get(t.obj, "sandboxes")) == 0,
       "list answers once: no sandboxes");

    sink_init(&t);
    svc_health(&d, &t.base);
    ok(t.answers == 1 && !strcmp(json_string_value(json_object_get(t.obj, "driver")) ?: "", "fake"),
       "health names the driver");

    sink_init(&t);
    svc_sandbox_get(&d, MISSING, &t.base);
    ok(t.answers == 1 && t.status == -1 && t.err.kind == WR_E_NOT_FOUND &&
           strstr(t.err.msg, MISSING),
       "get of an unknown sandbox: not found, naming it (%s)", t.err.msg);

    sink_init(&t);
    svc_sandbox_get(&d, "../../etc", &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "an id that is no id: not found");

    sink_init(&t);
    svc_sandbox_delete(&d, MISSING, &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "delete of an unknown sandbox");

    sink_init(&t);
    svc_sandbox_set_timeout(&d, MISSING, 60, &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "timeout of an unknown sandbox");

    sink_init(&t);
    struct exec_request r = {.command = "true", .timeout_seconds = 5, .max_output = 1024};
    svc_exec(&d, MISSING, &r, &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "exec in an unknown sandbox");

    sink_init(&t);
    svc_command_get(&d, MISSING, "cmd-1", &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "a command of an unknown sandbox");

    sink_init(&t);
    svc_file_read(&d, MISSING, "", 0, UINT64_MAX, &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_INVALID && strstr(t.err.msg, "path"),
       "an empty path is invalid before the sandbox is looked up (%s)", t.err.msg);

    sink_init(&t);
    svc_file_stat(&d, MISSING, "\xff\xfe", &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_INVALID, "a path that is not UTF-8 is invalid");

    sink_init(&t);
    svc_file_list(&d, MISSING, "/workspace", &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND, "list in an unknown sandbox");

    sink_init(&t);
    struct sandbox_opts o = {.image = "not-built",
                             .cpus = 1,
                             .memory_mib = 256,
                             .disk_mib = 64,
                             .timeout_seconds = 60,
                             .on_lease_end = "stop"};
    svc_sandbox_create(&d, &o, &t.base);
    ok(t.answers == 1 && t.err.kind == WR_E_NOT_FOUND && strstr(t.err.msg, "not-built"),
       "create from an image that is not built: not found (%s)", t.err.msg);

    json_t *e = svc_enums();
    ok(json_array_size(json_object_get(e, "states")) == 7 &&
           json_array_size(json_object_get(e, "reasons")) >= 10,
       "enums: 7 states and the reasons");
    json_decref(e);

    sink_init(&t);
    store_close(d.store);
    event_base_free(d.base);
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        return 1;
    return tap_done();
}
