/*
 * The agent running commands: HELLO and PING, exec with its argv, environment, working
 * directory and errors, stdin, many commands at once and large output, and signals to whole
 * process trees (agent_harness.h starts the real agent binary).
 */
#include "agent_harness.h"

static void test_hello(struct agent *a)
{
    struct frame *f = read_frame(a, TIMEOUT_MS);
    struct proto_field fl;
    uint32_t version = 0, pid = 0;
    ok(f && f->h.type == PROTO_HELLO && f->h.id == 0, "first frame is HELLO with id 0");
    if (f) {
        if (proto_find(f->payload, f->h.len, PT_VERSION, &fl) == 1)
            proto_field_u32(&fl, &version);
        if (proto_find(f->payload, f->h.len, PT_PID, &fl) == 1)
            proto_field_u32(&fl, &pid);
        free(f->payload);
        free(f);
    }
    ok(version == PROTO_VERSION && pid == (uint32_t)a->pid, "HELLO carries VERSION and PID");

    struct result r = {0};
    uint32_t id = next_id++;
    send_frame(a, id, PROTO_PING, 0, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.pong, "PING is answered by PONG with the same id");
    result_free(&r);
}

static void test_exec_basic(struct agent *a)
{
    struct result r = {0};
    const char *echo[] = {"echo", "hi", NULL};
    uint32_t id = exec_req(a, echo, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0 && r.term_signal == 0 &&
           r.out.len == 3 && !memcmp(r.out.data, "hi\n", 3) && r.err.len == 0,
       "echo hi: STDOUT \"hi\\n\" then EXIT 0");
    result_free(&r);

    id = sh_req(a, "exit 3");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 3 && r.term_signal == 0,
       "exit code 3 is reported");
    result_free(&r);

    id = sh_req(a, "echo out; echo err >&2; echo out2");
    ok(collect(a, id, &r) == 0 && r.exited && r.out.len &&
           !strcmp((char *)r.out.data, "out\nout2\n") && r.err.len &&
           !strcmp((char *)r.err.data, "err\n"),
       "stdout and stderr arrive apart");
    result_free(&r);

    id = sh_req(a, "kill -TERM $$");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == -1 && r.term_signal == SIGTERM,
       "death by signal: EXIT_CODE -1, TERM_SIGNAL 15");
    result_free(&r);

    const char *pwd[] = {"pwd", NULL};
    char real[PATH_MAX], want[PATH_MAX + 2];
    realpath(tmpdir, real);
    snprintf(want, sizeof(want), "%s\n", real);
    id = exec_req(a, pwd, base_env, real, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, want),
       "CWD is the command's working directory");
    result_free(&r);

    /* env is replaced exactly: not even PATH is added (env itself is found on the default PATH) */
    const char *env_argv[] = {"env", NULL};
    const char *env[] = {"A=1", "B=two words", NULL};
    id = exec_req(a, env_argv, env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "A=1\nB=two words\n"),
       "ENV replaces the environment exactly; default PATH used for the lookup");
    result_free(&r);

    /* the command's own PATH is searched; a script without #! runs under /bin/sh */
    char bin[PATH_MAX], script[PATH_MAX + 16], penv[PATH_MAX + 8];
    tpath(bin, sizeof(bin), "bin");
    mkdir(bin, 0755);
    snprintf(script, sizeof(script), "%s/hello-wr", bin);
    FILE *fp = fopen(script, "w");
    fputs("echo from script \"$1\"\n", fp);
    fclose(fp);
    chmod(script, 0755);
    snprintf(penv, sizeof(penv), "PATH=/nonexistent:%s", bin);
    const char *sargv[] = {"hello-wr", "arg1", NULL};
    const char *senv[] = {penv, NULL};
    id = exec_req(a, sargv, senv, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "from script arg1\n"),
       "PATH from ENV is searched; a #!-less script runs under sh");
    result_free(&r);

    const char *nf[] = {"no-such-command-xyz", NULL};
    id = exec_req(a, nf, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT &&
           !strcmp(r.msg, "command not found: no-such-command-xyz") && !r.exited,
       "command not found: one ERROR ENOENT (\"%s\")", r.msg);
    result_free(&r);

    chmod(script, 0644);
    const char *nx[] = {script, NULL};
    id = exec_req(a, nx, base_env, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EACCES && strstr(r.msg, "exec "),
       "not executable: ERROR EACCES (\"%s\")", r.msg);
    result_free(&r);

    /* execvp's search, though missing entries are skipped before the child starts: a match
     * that is not executable is passed over for a later one, and is the answer (EACCES) only
     * when nothing else is found */
    char bin2[PATH_MAX], script2[PATH_MAX + 16], penv2[2 * PATH_MAX + 32];
    tpath(bin2, sizeof(bin2), "bin2");
    mkdir(bin2, 0755);
    snprintf(script2, sizeof(script2), "%s/hello-wr", bin2);
    fp = fopen(script2, "w");
    fputs("echo from the second\n", fp);
    fclose(fp);
    chmod(script2, 0755);
    snprintf(penv2, sizeof(penv2), "PATH=/nonexistent:/nonexistent2/x:%s:%s", bin, bin2);
    const char *senv2[] = {penv2, NULL};
    id = exec_req(a, sargv, senv2, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "from the second\n"),
       "a match that is not executable is passed over for a later one");
    result_free(&r);
    snprintf(penv2, sizeof(penv2), "PATH=/nonexistent:%s:/nonexistent2", bin);
    id = exec_req(a, sargv, senv2, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EACCES,
       "only a match that is not executable: ERROR EACCES (\"%s\")", r.msg);
    result_free(&r);
    snprintf(penv2, sizeof(penv2), "PATH=/nonexistent:/nonexistent2");
    id = exec_req(a, sargv, senv2, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT &&
           !strcmp(r.msg, "command not found: hello-wr"),
       "no match in any entry: command not found (\"%s\")", r.msg);
    result_free(&r);

    id = exec_req(a, echo, base_env, "/nonexistent-dir-xyz", 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT &&
           !strcmp(r.msg, "cwd /nonexistent-dir-xyz: No such file or directory"),
       "bad cwd: ERROR ENOENT (\"%s\")", r.msg);
    result_free(&r);
}

static void test_stdin(struct agent *a)
{
    struct result r = {0};
    const char *cat[] = {"cat", NULL};
    uint32_t id = exec_req(a, cat, base_env, NULL, 1);
    send_frame(a, id, PROTO_STDIN, 0, "hello ", 6);
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, "world", 5);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == 11 &&
           !memcmp(r.out.data, "hello world", 11),
       "STDIN frames feed the command; FIN closes its stdin");
    result_free(&r);

    /* More than a pipe holds, through cat and back: stdin must be buffered, not blocking. */
    size_t big = 3u << 20;
    uint8_t *data = malloc(big);
    for (size_t i = 0; i < big; i++)
        data[i] = (uint8_t)(i * 7 + (i >> 12));
    id = exec_req(a, cat, base_env, NULL, 1);
    for (size_t off = 0; off < big; off += PROTO_CHUNK)
        send_frame(a, id, PROTO_STDIN, 0, data + off,
                   big - off < PROTO_CHUNK ? big - off : PROTO_CHUNK);
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == big &&
           !memcmp(r.out.data, data, big),
       "3 MiB through cat's stdin and stdout arrive intact");
    result_free(&r);
    free(data);

    /* without STDIN_PIPE stdin is /dev/null */
    id = sh_req(a, "cat; echo done");
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len &&
           !strcmp((char *)r.out.data, "done\n"),
       "stdin is /dev/null by default");
    result_free(&r);
}

static void test_many(struct agent *a)
{
    enum { N = 24 };
    uint32_t ids[N];
    char envs[N][32];
    for (int i = 0; i < N; i++) {
        snprintf(envs[i], sizeof(envs[i]), "N=%d", i);
        const char *argv[] = {"sh", "-c", "sleep 0.2; echo $N", NULL};
        const char *env[] = {base_env[0], envs[i], NULL};
        ids[i] = exec_req(a, argv, env, NULL, 0);
    }
    int good = 0;
    for (int i = N - 1; i >= 0; i--) {
        struct result r = {0};
        char want[16];
        snprintf(want, sizeof(want), "%d\n", i);
        if (collect(a, ids[i], &r) == 0 && r.exited && r.exit_code == 0 && r.out.len &&
            !strcmp((char *)r.out.data, want))
            good++;
        result_free(&r);
    }
    ok(good == N, "%d commands at once, each with its own output (%d right)", N, good);

    /* lots of output, read late: the agent holds back instead of dropping or blocking */
    struct result r = {0};
    uint32_t id = sh_req(a, "head -c 12000000 /dev/zero; echo tail >&2");
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    int zeros = 1;
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && r.out.len == 12000000 && r.err.len == 5,
       "12 MB of output arrives whole (%zu bytes)", r.out.len);
    for (size_t i = 0; i < r.out.len && zeros; i++)
        zeros = r.out.data[i] == 0;
    ok(zeros, "and unaltered");
    result_free(&r);
}

static void test_signal(struct agent *a)
{
    struct result r = {0};
    /* a background child, one that setsid'd away, one orphaned into our process group */
    uint32_t id = sh_req(a, "sleep 1000 & echo $!; setsid sleep 1000 & echo $!; "
                            "(sleep 1000 & echo $!); echo $$; wait");
    int got = collect_until(a, id, &r, 4);
    pid_t pids[4] = {0};
    if (got == 1)
        sscanf((char *)r.out.data, "%d %d %d %d", &pids[0], &pids[1], &pids[2], &pids[3]);
    ok(got == 1 && pids[0] > 0 && pids[1] > 0 && pids[2] > 0 && pids[3] > 0,
       "process tree started (%d %d %d %d)", pids[0], pids[1], pids[2], pids[3]);

    struct proto_buf b = {0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    send_fields(a, id, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == -1 && r.term_signal == SIGKILL,
       "SIGNAL SIGKILL ends the command: EXIT with TERM_SIGNAL 9");
    int gone = 0;
    for (int i = 0; i < 4; i++)
        gone += pids[i] > 0 && pid_gone(pids[i], 5000);
    ok(gone == 4, "every process of the tree is gone and reaped (%d of 4)", gone);
    result_free(&r);

    /* SIGTERM reaches a setsid'd descendant too */
    /* The outer shell traps TERM so it waits for the inner one instead of dying first. */
    id = sh_req(a, "trap 'echo outer-term' TERM; "
                   "setsid sh -c 'trap \"echo got-term; exit 0\" TERM; echo ready; "
                   "while :; do sleep 0.05; done'; echo parent-done");
    got = collect_until(a, id, &r, 1);
    b = (struct proto_buf){0};
    proto_put_u32(&b, PT_SIGNUM, SIGTERM);
    send_fields(a, id, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    ok(got == 1 && collect(a, id, &r) == 0 && r.exited && strstr((char *)r.out.data, "got-term"),
       "SIGNAL SIGTERM reaches a descendant in another session");
    result_free(&r);

    /* A background child holding the pipes does not hold EXIT back (it would wait forever);
     * once it dies, the agent reaps it as an orphan. */
    id = sh_req(a, "sleep 1000 & echo $!");
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0 && r.out.len,
       "EXIT arrives while a background child still holds stdout");
    pid_t bg = r.out.len ? atoi((char *)r.out.data) : 0;
    if (bg > 0)
        kill(bg, SIGKILL);
    ok(bg > 0 && pid_gone(bg, 5000), "the orphan is reaped when it dies (pid %d)", bg);
    result_free(&r);

    /* frames for unknown ids are ignored silently */
    send_frame(a, 999999, PROTO_STDIN, 0, "x", 1);
    send_frame(a, 999998, PROTO_DATA, PROTO_F_FIN, "x", 1);
    b = (struct proto_buf){0};
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    send_fields(a, 999997, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    uint32_t pid = next_id++;
    send_frame(a, pid, PROTO_PING, 0, NULL, 0);
    ok(collect(a, pid, &r) == 0 && r.pong && a->queue == NULL,
       "STDIN/DATA/SIGNAL for unknown ids get no answer");
    result_free(&r);
}

/* PINGs and returns the PONG's PROCS (-1: absent); frames of other ids are dropped. */
static long ping_procs(struct agent *a)
{
    uint32_t id = next_id++;
    send_frame(a, id, PROTO_PING, 0, NULL, 0);
    for (;;) {
        struct frame *f = read_frame(a, TIMEOUT_MS);
        if (!f)
            return -2;
        long procs = -3;
        if (f->h.id == id && f->h.type == PROTO_PONG) {
            struct proto_field fl;
            uint32_t v = 0;
            procs = proto_find(f->payload, f->h.len, PT_PROCS, &fl) == 1 &&
                            proto_field_u32(&fl, &v) == 0
                        ? (long)v
                        : -1;
        }
        free(f->payload);
        free(f);
        if (procs != -3)
            return procs;
    }
}

/* PONG says how many processes run besides the agent's own: what the daemon's idle freezing
 * (daemon/idle.h) waits to be 0. */
static void test_pong_procs(struct agent *a)
{
    long n = ping_procs(a);
    ok(n == 0, "at rest, PONG counts no process besides the agent's (%ld)", n);
    const char *sleeper[] = {"sleep", "2", NULL};
    uint32_t id = exec_req(a, sleeper, base_env, NULL, 0);
    n = ping_procs(a);
    ok(n >= 1, "with a command running, PONG counts it (%ld)", n);
    struct result r = {0};
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0, "the command ends");
    result_free(&r);
    n = ping_procs(a);
    ok(n == 0, "and once it has, none again (%ld)", n);
}

/* A SESSION running script under sh, on a terminal (tty) of rows x cols or on pipes. */
static uint32_t session_req(struct agent *a, const char *script, int tty, int rows, int cols)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_ARG, "sh");
    proto_put_str(&b, PT_ARG, "-c");
    proto_put_str(&b, PT_ARG, script);
    proto_put_str(&b, PT_ENV, base_env[0]);
    proto_put_str(&b, PT_CWD, tmpdir);
    proto_put_u32(&b, PT_TTY, (uint32_t)tty);
    if (rows)
        proto_put_u32(&b, PT_ROWS, (uint32_t)rows);
    if (cols)
        proto_put_u32(&b, PT_COLS, (uint32_t)cols);
    send_fields(a, id, PROTO_SESSION, &b);
    proto_buf_free(&b);
    return id;
}

static int out_has(const struct result *r, const char *needle)
{
    return r->out.len && memmem(r->out.data, r->out.len, needle, strlen(needle)) != NULL;
}

static void test_session(struct agent *a)
{
    struct result r = {0};
    /* On a terminal: sized as asked, its controlling terminal, stdin and stdout both. */
    uint32_t id = session_req(a,
                              "stty size; [ -t 0 ] && [ -t 1 ] && [ -t 2 ] && echo all-tty; "
                              "read x; echo got-$x; exit 5",
                              1, 7, 33);
    ok(collect_until(a, id, &r, 2) == 1 && out_has(&r, "7 33") && out_has(&r, "all-tty"),
       "SESSION with TTY: the size asked for, stdin/stdout/stderr a terminal");
    send_frame(a, id, PROTO_STDIN, 0, "abc\n", 4);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 5 && out_has(&r, "got-abc") &&
           r.err.len == 0,
       "typed input reaches it (echoed by the terminal), output comes as STDOUT, EXIT 5");
    result_free(&r);

    /* RESIZE: the new size, and SIGWINCH to the foreground group */
    id = session_req(a, "trap 'echo winch' WINCH; echo ready; read x; stty size; read y; echo end",
                     1, 0, 0);
    ok(collect_until(a, id, &r, 1) == 1 && out_has(&r, "ready"), "a session with default size");
    struct proto_buf b = {0};
    proto_put_u32(&b, PT_ROWS, 50);
    proto_put_u32(&b, PT_COLS, 132);
    send_fields(a, id, PROTO_RESIZE, &b);
    proto_buf_free(&b);
    send_frame(a, id, PROTO_STDIN, 0, "go\n", 3);
    ok(collect_until(a, id, &r, 4) == 1 && out_has(&r, "50 132") && out_has(&r, "winch"),
       "RESIZE sets the terminal's size and the shell gets SIGWINCH");
    /* FIN on a terminal is its end-of-file character: read sees EOF, the script goes on */
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0 && out_has(&r, "end"),
       "STDIN FIN on a terminal is ^D");
    result_free(&r);

    /* Without TTY: pipes, stdin always fed, FIN closes it */
    id = session_req(a, "[ -t 0 ] || echo not-tty; wc -c; echo oops >&2", 0, 0, 0);
    send_frame(a, id, PROTO_STDIN, PROTO_F_FIN, "12345", 5);
    ok(collect(a, id, &r) == 0 && r.exit_code == 0 && out_has(&r, "not-tty") && out_has(&r, "5") &&
           r.err.len == 5,
       "SESSION without TTY: pipes, stdin fed, stderr apart");
    result_free(&r);

    /* SIGNAL reaches a session's tree; a bad TTY value is refused */
    id = session_req(a, "echo up; sleep 30", 1, 0, 0);
    collect_until(a, id, &r, 1);
    proto_put_u32(&b, PT_SIGNUM, SIGKILL);
    send_fields(a, id, PROTO_SIGNAL, &b);
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.exited && r.term_signal == SIGKILL,
       "SIGNAL KILL ends a session on a terminal");
    result_free(&r);
    id = session_req(a, "true", 2, 0, 0);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL, "TTY 2 is ERROR EINVAL");
    result_free(&r);
    id = session_req(a, "true", 1, 0, 0);
    proto_put_u32(&b, PT_ROWS, 0);
    proto_put_u32(&b, PT_COLS, 80);
    send_fields(a, id, PROTO_RESIZE, &b); /* out of range: logged, ignored */
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.exited && r.exit_code == 0,
       "a bad RESIZE is ignored, the session is not disturbed");
    result_free(&r);
}

int main(int argc, char **argv)
{
    struct agent a;
    if (harness_begin(argc, argv, &a) < 0)
        return tap_done();
    test_hello(&a);
    test_exec_basic(&a);
    test_stdin(&a);
    test_many(&a);
    test_signal(&a);
    test_pong_procs(&a);
    test_session(&a);
    harness_stop_agent(&a);
    return harness_done();
}
