/*
 * The agent's guard on its channel: malformed requests answered with ERROR, the cap on live
 * requests, and the frames that are fatal, and EOF, after which its commands must be gone
 * (agent_harness.h starts the real agent binary).
 */
#include "agent_harness.h"

static void test_bad_requests(struct agent *a)
{
    struct result r = {0};
    struct proto_buf b = {0};
    uint32_t id;

    id = next_id++;
    proto_put_str(&b, PT_CWD, "/");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "EXEC without ARG: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_bytes(&b, PT_ARG, "ec\0ho", 5);
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "ARG with NUL: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_bytes(&b, PT_STDIN_PIPE, "\0\1", 2);
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "2-byte STDIN_PIPE: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_str(&b, PT_ENV, "NOEQUALS");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "ENV without '=': EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    proto_put_str(&b, PT_CWD, tmpdir);
    proto_put_str(&b, 999, "unknown tags are skipped");
    send_fields(a, id, PROTO_EXEC, &b);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0, "unknown field tags are ignored");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_ARG, "true");
    send_frame(a, id, PROTO_EXEC, PROTO_F_FIN, b.data, b.len);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "FIN on EXEC: EINVAL");
    result_free(&r);

    id = next_id++;
    send_frame(a, id, PROTO_EXEC, 0,
               "\0\3\0\0\0\11"
               "ab",
               8);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "truncated field: EINVAL");
    result_free(&r);

    id = path_req(a, PROTO_FILE_STAT, "", 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "empty PATH: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_bytes(&b, PT_PATH, "/tmp\0/x", 7);
    send_fields(a, id, PROTO_FILE_STAT, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "PATH with NUL: EINVAL");
    result_free(&r);

    char *longp = malloc(PROTO_MAX_PATH + 2);
    memset(longp, 'a', PROTO_MAX_PATH + 1);
    longp[0] = '/';
    longp[PROTO_MAX_PATH + 1] = '\0';
    id = path_req(a, PROTO_FILE_STAT, longp, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENAMETOOLONG,
       "PATH over PROTO_MAX_PATH: ENAMETOOLONG");
    result_free(&r);
    free(longp);

    id = next_id++;
    send_frame(a, id, PROTO_FILE_STAT, 0, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "FILE_STAT without PATH: EINVAL");
    result_free(&r);

    proto_buf_reset(&b);
    id = next_id++;
    proto_put_str(&b, PT_PATH, tmpdir);
    proto_put_u32(&b, PT_OFFSET, 5);
    send_fields(a, id, PROTO_FILE_READ, &b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "4-byte OFFSET: EINVAL");
    result_free(&r);

    id = path_req(a, PROTO_FILE_MKDIR, "/tmp/x", 0x100, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "unknown WFLAGS bit: EINVAL");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, "/tmp/x", 0, 010000);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "MODE over 07777: EINVAL");
    result_free(&r);
    proto_buf_free(&b);
}

static void test_cap(struct agent *a)
{
    /* Open writes are cheap live requests: fill the table, see the next one refused. */
    enum { CAP = 1024 };
    char path[PATH_MAX];
    tpath(path, sizeof(path), "cap.txt");
    uint32_t first = next_id;
    for (int i = 0; i < CAP; i++)
        path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    struct result r = {0};
    uint32_t id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EAGAIN,
       "request %d over the cap: ERROR EAGAIN", CAP + 1);
    result_free(&r);
    int done = 0;
    for (int i = 0; i < CAP; i++)
        send_frame(a, first + (uint32_t)i, PROTO_DATA, PROTO_F_FIN, NULL, 0);
    for (int i = 0; i < CAP; i++) {
        if (collect(a, first + (uint32_t)i, &r) == 0 && r.ok)
            done++;
        result_free(&r);
    }
    ok(done == CAP, "the %d live requests all complete (%d)", CAP, done);
}

static void test_teardown(void)
{
    struct agent a;
    struct result r = {0};

    /* unknown type in a header: fatal */
    agent_start(&a);
    uint8_t raw[PROTO_HEADER_LEN];
    struct proto_header h = {.len = 0, .id = 1, .type = 999, .flags = 0};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    int st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "unknown frame type: agent exits 2");
    agent_close(&a);

    /* oversized length: fatal */
    agent_start(&a);
    h = (struct proto_header){.len = PROTO_MAX_PAYLOAD + 1, .id = 1, .type = PROTO_DATA};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "oversized frame: agent exits 2");
    agent_close(&a);

    /* a type only the agent sends: fatal */
    agent_start(&a);
    h = (struct proto_header){.len = 0, .id = 1, .type = PROTO_OK};
    proto_header_encode(&h, raw);
    write_all(a.fd, raw, sizeof(raw));
    st = agent_wait(&a, 5000);
    ok(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2, "OK sent to the agent: agent exits 2");
    agent_close(&a);

    /* EOF: running commands are killed, the agent exits 0 */
    agent_start(&a);
    uint32_t id = sh_req(&a, "setsid sleep 1000 & echo $!; echo $$; exec sleep 1000");
    int got = collect_until(&a, id, &r, 2);
    pid_t p1 = 0, p2 = 0;
    if (got == 1)
        sscanf((char *)r.out.data, "%d %d", &p1, &p2);
    result_free(&r);
    close(a.fd);
    a.fd = -1;
    st = agent_wait(&a, 5000);
    ok(got == 1 && st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "EOF: agent exits 0");
    ok(p1 > 0 && p2 > 0 && pid_gone(p1, 5000) && pid_gone(p2, 5000),
       "EOF: the agent's commands are killed (%d %d)", p1, p2);
    agent_close(&a);
}

int main(int argc, char **argv)
{
    struct agent a;
    if (harness_begin(argc, argv, &a) < 0)
        return tap_done();
    ok(agent_skip_hello(&a), "the agent says HELLO first");
    test_bad_requests(&a);
    test_cap(&a);
    harness_stop_agent(&a);
    test_teardown();
    return harness_done();
}
