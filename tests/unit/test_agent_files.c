/*
 * The agent's file operations: reads and writes (whole, sliced, appended, exclusive, large and
 * byte-exact), listing, stat, mkdir and remove, including symlinks that must not be followed
 * (agent_harness.h starts the real agent binary).
 */
#include "agent_harness.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint8_t rng_byte(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint8_t)rng_state;
}

static uint32_t read_req(struct agent *a, const char *path, int64_t off, int64_t len)
{
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    if (off >= 0)
        proto_put_u64(&b, PT_OFFSET, (uint64_t)off);
    if (len >= 0)
        proto_put_u64(&b, PT_LENGTH, (uint64_t)len);
    send_fields(a, id, PROTO_FILE_READ, &b);
    proto_buf_free(&b);
    return id;
}

static void test_files_rw(struct agent *a)
{
    struct result r = {0};
    size_t size = 3000000 + 17;
    uint8_t *data = malloc(size);
    for (size_t i = 0; i < size; i++)
        data[i] = rng_byte();
    char path[PATH_MAX];
    tpath(path, sizeof(path), "a/b/c/big.bin");

    uint32_t id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_PARENTS, 0600);
    for (size_t off = 0; off < size; off += PROTO_CHUNK) {
        size_t n = size - off < PROTO_CHUNK ? size - off : PROTO_CHUNK;
        send_frame(a, id, PROTO_DATA, off + n == size ? PROTO_F_FIN : 0, data + off, n);
    }
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.size == size &&
           r.stat.type == PROTO_FT_FILE && r.stat.mode == 0600,
       "FILE_WRITE with PARENTS and MODE: STAT_RESULT then OK");
    result_free(&r);

    struct stat st;
    uint8_t *disk = malloc(size + 1);
    FILE *fp = fopen(path, "rb");
    size_t got = fp ? fread(disk, 1, size + 1, fp) : 0;
    if (fp)
        fclose(fp);
    ok(got == size && !memcmp(disk, data, size) && stat(path, &st) == 0 &&
           (st.st_mode & 07777) == 0600,
       "file on disk is byte-exact with mode 0600");
    free(disk);

    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.size == size &&
           r.data.len == size && !memcmp(r.data.data, data, size),
       "FILE_READ of the whole file is byte-exact");
    result_free(&r);

    id = read_req(a, path, 1234567, 1000001);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 1000001 &&
           !memcmp(r.data.data, data + 1234567, 1000001),
       "FILE_READ with OFFSET and LENGTH returns that slice");
    result_free(&r);

    id = read_req(a, path, (int64_t)size - 10, 1000);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 10 &&
           !memcmp(r.data.data, data + size - 10, 10),
       "LENGTH past the end stops at EOF");
    result_free(&r);

    id = read_req(a, path, (int64_t)size + 10, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.data.len == 0,
       "OFFSET past the end: STAT_RESULT, no DATA, OK");
    result_free(&r);

    id = read_req(a, path, 0, 0);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 0, "LENGTH 0 reads nothing");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_EXCL, -1);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "x", 1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST,
       "EXCL on an existing file: ERROR EEXIST");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, PROTO_W_APPEND, -1);
    send_frame(a, id, PROTO_DATA, 0, "ab", 2);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "c", 1);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == size + 3 && r.stat.mode == 0600,
       "APPEND appends and keeps the mode when MODE is absent");
    result_free(&r);

    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, NULL, 0);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == 0, "plain write truncates; empty FIN");
    result_free(&r);

    tpath(path, sizeof(path), "a");
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EISDIR && r.nstat == 0,
       "FILE_READ of a directory: ERROR EISDIR");
    result_free(&r);

    tpath(path, sizeof(path), "nope/x");
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT, "FILE_READ of nothing: ENOENT");
    result_free(&r);
    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT,
       "FILE_WRITE without PARENTS into a missing directory: ENOENT");
    result_free(&r);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "late", 4); /* ignored */

    /* a duplicate id is refused without disturbing the live request */
    tpath(path, sizeof(path), "dup.txt");
    id = path_req(a, PROTO_FILE_WRITE, path, 0, -1);
    struct proto_buf b = {0};
    proto_put_str(&b, PT_PATH, path);
    send_fields(a, id, PROTO_FILE_WRITE, &b);
    proto_buf_free(&b);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST, "duplicate live id: EEXIST");
    result_free(&r);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, "one", 3);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.size == 3, "the first request still completes");
    result_free(&r);
    free(data);
}

static void test_files_meta(struct agent *a)
{
    struct result r = {0};
    char path[PATH_MAX], p2[PATH_MAX];

    /* list */
    tpath(path, sizeof(path), "list");
    mkdir(path, 0755);
    tpath(p2, sizeof(p2), "list/f1");
    FILE *fp = fopen(p2, "w");
    fputs("12345", fp);
    fclose(fp);
    tpath(p2, sizeof(p2), "list/d1");
    mkdir(p2, 0700);
    tpath(p2, sizeof(p2), "list/l1");
    symlink("f1", p2);
    uint32_t id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    int seen = 0;
    if (collect(a, id, &r) == 0 && r.ok && r.nentries == 3) {
        for (int i = 0; i < 3; i++) {
            struct entry *e = &r.entries[i];
            if (!strcmp(e->name, "f1") && e->type == PROTO_FT_FILE && e->size == 5)
                seen |= 1;
            if (!strcmp(e->name, "d1") && e->type == PROTO_FT_DIR && e->mode == 0700)
                seen |= 2;
            if (!strcmp(e->name, "l1") && e->type == PROTO_FT_SYMLINK && !strcmp(e->target, "f1"))
                seen |= 4;
        }
    }
    ok(seen == 7, "FILE_LIST: file, directory and symlink (with TARGET), no . or ..");
    result_free(&r);

    tpath(path, sizeof(path), "many");
    mkdir(path, 0755);
    for (int i = 0; i < 3000; i++) {
        snprintf(p2, sizeof(p2), "%s/many/file-with-a-longish-name-%04d", tmpdir, i);
        close(open(p2, O_WRONLY | O_CREAT, 0644));
    }
    id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nentries == 3000 && r.entry_frames > 1,
       "FILE_LIST of 3000 entries spans several frames (%d entries, %d frames)", r.nentries,
       r.entry_frames);
    result_free(&r);

    tpath(path, sizeof(path), "list/f1");
    id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTDIR, "FILE_LIST of a file: ENOTDIR");
    result_free(&r);

    /* stat */
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nstat == 1 && r.stat.type == PROTO_FT_FILE &&
           r.stat.size == 5,
       "FILE_STAT of a file");
    result_free(&r);
    tpath(path, sizeof(path), "list/l1");
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.stat.type == PROTO_FT_SYMLINK &&
           !strcmp(r.stat.target, "f1"),
       "FILE_STAT does not follow a symlink and reports TARGET");
    result_free(&r);
    tpath(path, sizeof(path), "list/none");
    id = path_req(a, PROTO_FILE_STAT, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT && strstr(r.msg, path),
       "FILE_STAT of nothing: ENOENT naming the path");
    result_free(&r);

    /* mkdir */
    tpath(path, sizeof(path), "m/x/y");
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    struct stat st;
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) == 0 && S_ISDIR(st.st_mode),
       "FILE_MKDIR with PARENTS creates the chain");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    ok(collect(a, id, &r) == 0 && r.ok, "again with PARENTS: OK");
    result_free(&r);
    id = path_req(a, PROTO_FILE_MKDIR, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST, "again without PARENTS: EEXIST");
    result_free(&r);
    tpath(path, sizeof(path), "m/z");
    id = path_req(a, PROTO_FILE_MKDIR, path, 0, 0700);
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) == 0 && (st.st_mode & 07777) == 0700,
       "FILE_MKDIR with MODE 0700");
    result_free(&r);
    tpath(path, sizeof(path), "list/f1/sub");
    id = path_req(a, PROTO_FILE_MKDIR, path, PROTO_W_PARENTS, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTDIR, "mkdir under a file: ENOTDIR");
    result_free(&r);

    /* remove */
    tpath(path, sizeof(path), "outside");
    mkdir(path, 0755);
    tpath(p2, sizeof(p2), "outside/keep.txt");
    close(open(p2, O_WRONLY | O_CREAT, 0644));
    const char *tree[] = {"r", "r/d1", "r/d1/d2", "r/d1/d2/d3", "r/e"};
    for (size_t i = 0; i < WR_ARRAY_LEN(tree); i++) {
        tpath(p2, sizeof(p2), tree[i]);
        mkdir(p2, 0755);
        snprintf(p2 + strlen(p2), sizeof(p2) - strlen(p2), "/file");
        close(open(p2, O_WRONLY | O_CREAT, 0644));
    }
    tpath(p2, sizeof(p2), "r/d1/link-out");
    symlink(path, p2);
    tpath(p2, sizeof(p2), "r/d1/d2/ro");
    mkdir(p2, 0555); /* removable: it is empty, and its parent is writable */

    tpath(path, sizeof(path), "r");
    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOTEMPTY,
       "FILE_REMOVE of a full directory without RECURSIVE: ENOTEMPTY");
    result_free(&r);
    id = path_req(a, PROTO_FILE_REMOVE, path, PROTO_W_RECURSIVE, -1);
    ok(collect(a, id, &r) == 0 && r.ok && lstat(path, &st) < 0 && errno == ENOENT,
       "FILE_REMOVE RECURSIVE removes the tree");
    result_free(&r);
    tpath(p2, sizeof(p2), "outside/keep.txt");
    ok(stat(p2, &st) == 0, "a symlink inside the tree was not followed");

    tpath(p2, sizeof(p2), "link-to-outside");
    tpath(path, sizeof(path), "outside");
    symlink(path, p2);
    snprintf(path, sizeof(path), "%s/", p2);
    id = path_req(a, PROTO_FILE_REMOVE, path, PROTO_W_RECURSIVE, -1);
    tpath(path, sizeof(path), "outside/keep.txt");
    ok(collect(a, id, &r) == 0 && r.ok && lstat(p2, &st) < 0 && stat(path, &st) == 0,
       "removing \"link/\" removes the link, not its target's contents");
    result_free(&r);

    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && stat(path, &st) < 0, "FILE_REMOVE of a file");
    result_free(&r);
    id = path_req(a, PROTO_FILE_REMOVE, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ENOENT, "FILE_REMOVE of nothing: ENOENT");
    result_free(&r);
}

/* Output bytes for id that arrive within quiet_ms of each other, up to want; other ids'
 * frames are kept for later. Sets *ended if the request's terminal frame came. */
static size_t drain_output(struct agent *a, uint32_t id, size_t want, int quiet_ms, int *ended)
{
    size_t got = 0;
    *ended = 0;
    while (got < want || want == 0) {
        struct frame *f = read_frame(a, quiet_ms);
        if (!f)
            break;
        if (f->h.id == id) {
            if (f->h.type == PROTO_DATA || f->h.type == PROTO_STDOUT)
                got += f->h.len;
            if (terminal(f->h.type))
                *ended = 1;
        }
        free(f->payload);
        free(f);
        if (*ended)
            break;
    }
    return got;
}

static void send_credit(struct agent *a, uint32_t id, uint64_t n)
{
    struct proto_buf b = {0};
    proto_put_u64(&b, PT_LENGTH, n);
    send_fields(a, id, PROTO_CREDIT, &b);
    proto_buf_free(&b);
}

/* PING, then every frame up to its PONG: returns how many of them were for `id`. */
static int frames_before_pong(struct agent *a, uint32_t id, int *pong)
{
    uint32_t ping = next_id++;
    send_frame(a, ping, PROTO_PING, 0, NULL, 0);
    int n = 0;
    *pong = 0;
    struct frame *f;
    while ((f = read_frame(a, TIMEOUT_MS))) {
        int is_pong = f->h.id == ping && f->h.type == PROTO_PONG;
        n += f->h.id == id;
        free(f->payload);
        free(f);
        if (is_pong) {
            *pong = 1;
            break;
        }
    }
    return n;
}

static void test_flow_control(struct agent *a)
{
    char path[PATH_MAX];
    tpath(path, sizeof(path), "flow.bin");
    FILE *fp = fopen(path, "wb");
    static uint8_t block[65536];
    for (int i = 0; fp && i < 64; i++) /* 4 MiB */
        fwrite(block, 1, sizeof(block), fp);
    if (fp)
        fclose(fp);

    /* A read with a window sends that much and no more until CREDIT comes. */
    struct proto_buf b = {0};
    uint32_t id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    proto_put_u64(&b, PT_WINDOW, 100000);
    send_fields(a, id, PROTO_FILE_READ, &b);
    proto_buf_free(&b);
    int ended;
    size_t got = drain_output(a, id, 0, 300, &ended);
    ok(got == 100000 && !ended,
       "FILE_READ with WINDOW 100000 sends exactly 100000 bytes, then waits");
    send_credit(a, id, 1000000);
    got = drain_output(a, id, 1000000, TIMEOUT_MS, &ended);
    size_t extra = drain_output(a, id, 0, 300, &ended);
    ok(got == 1000000 && extra == 0 && !ended,
       "CREDIT 1000000 lets exactly that much more through");

    /* CANCEL ends it: nothing more for that id, and the agent answers the next request. */
    send_frame(a, id, PROTO_CANCEL, 0, NULL, 0);
    send_credit(a, id, 1000000); /* for a request that is gone: ignored */
    int pong;
    int late = frames_before_pong(a, id, &pong);
    ok(pong && late == 0, "after CANCEL the read sends nothing more; PING is answered");

    /* An EXEC with a window: its output stops at the window; CANCEL kills it (EXIT comes). */
    const char *const yes[] = {"/bin/sh", "-c", "exec yes", NULL};
    b = (struct proto_buf){0};
    id = next_id++;
    for (const char *const *p = yes; *p; p++)
        proto_put_str(&b, PT_ARG, *p);
    proto_put_str(&b, PT_ENV, "PATH=/usr/bin:/bin");
    proto_put_str(&b, PT_CWD, tmpdir);
    proto_put_u64(&b, PT_WINDOW, 50000);
    send_fields(a, id, PROTO_EXEC, &b);
    proto_buf_free(&b);
    got = drain_output(a, id, 0, 500, &ended);
    ok(got == 50000 && !ended, "EXEC of `yes` with WINDOW 50000 sends exactly 50000 bytes");
    send_frame(a, id, PROTO_CANCEL, 0, NULL, 0);
    struct result r = {0};
    ok(collect(a, id, &r) == 0 && r.exited && r.term_signal == SIGKILL && r.out.len == 0,
       "CANCEL kills the command: EXIT with SIGKILL, no more output");
    result_free(&r);

    /* A malformed WINDOW is refused. */
    b = (struct proto_buf){0};
    id = next_id++;
    proto_put_str(&b, PT_PATH, path);
    proto_put_u32(&b, PT_WINDOW, 5);
    send_fields(a, id, PROTO_FILE_READ, &b);
    proto_buf_free(&b);
    r = (struct result){0};
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EINVAL,
       "FILE_READ with a 4-byte WINDOW is EINVAL");
    result_free(&r);
    unlink(path);
}

static uint32_t write_small(struct agent *a, const char *path, uint32_t wflags, const char *text)
{
    uint32_t id = path_req(a, PROTO_FILE_WRITE, path, wflags, -1);
    send_frame(a, id, PROTO_DATA, PROTO_F_FIN, text, strlen(text));
    return id;
}

static off_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? st.st_size : -1;
}

/* Symlinks are followed by the agent itself, one component at a time; links in /proc never. */
static void test_files_links(struct agent *a)
{
    struct result r = {0};
    char path[PATH_MAX], p2[PATH_MAX], buf[64];
    uint32_t id;

    tpath(path, sizeof(path), "lk");
    mkdir(path, 0755);
    tpath(path, sizeof(path), "lk/real");
    mkdir(path, 0755);
    tpath(p2, sizeof(p2), "lk/dirlink");
    symlink(path, p2); /* absolute */
    tpath(p2, sizeof(p2), "lk/rel");
    symlink("target.txt", p2);

    tpath(path, sizeof(path), "lk/rel");
    id = write_small(a, path, 0, "hello");
    tpath(p2, sizeof(p2), "lk/target.txt");
    ok(collect(a, id, &r) == 0 && r.ok && file_size(p2) == 5,
       "a write through a relative symlink creates its target");
    result_free(&r);

    tpath(path, sizeof(path), "lk/dirlink/sub.txt");
    id = write_small(a, path, 0, "sub");
    tpath(p2, sizeof(p2), "lk/real/sub.txt");
    ok(collect(a, id, &r) == 0 && r.ok && file_size(p2) == 3,
       "a write through an absolute symlink to a directory lands in the directory");
    result_free(&r);

    tpath(path, sizeof(path), "lk/dirlink/../target.txt");
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len == 5 && !memcmp(r.data.data, "hello", 5),
       "\"..\" after a symlink is the parent of its target");
    result_free(&r);

    tpath(path, sizeof(path), "lk/dirlink");
    id = path_req(a, PROTO_FILE_LIST, path, 0, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.nentries == 1 && !strcmp(r.entries[0].name, "sub.txt"),
       "FILE_LIST follows a symlink to a directory");
    result_free(&r);

    tpath(path, sizeof(path), "lk/new1/new2/f");
    id = write_small(a, path, PROTO_W_PARENTS, "p");
    ok(collect(a, id, &r) == 0 && r.ok && file_size(path) == 1,
       "FILE_WRITE with PARENTS makes the missing directories");
    result_free(&r);

    tpath(path, sizeof(path), "lk/rel");
    id = write_small(a, path, PROTO_W_EXCL, "x");
    tpath(p2, sizeof(p2), "lk/target.txt");
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == EEXIST && file_size(p2) == 5,
       "EXCL on an existing symlink: EEXIST, its target untouched");
    result_free(&r);

    tpath(path, sizeof(path), "lk/loop1");
    symlink("loop2", path);
    tpath(p2, sizeof(p2), "lk/loop2");
    symlink("loop1", p2);
    id = read_req(a, path, -1, -1);
    ok(collect(a, id, &r) == 0 && r.error && r.err_no == ELOOP, "a symlink loop: ELOOP");
    result_free(&r);

    /* The agent's stderr is the harness's log file: no write may reach it through /proc. */
    snprintf(buf, sizeof(buf), "/proc/%d/fd/2", (int)a->pid);
    const char *magic[] = {"/proc/self/fd/2", buf, "/dev/stderr", "/proc/thread-self/fd/2"};
    for (size_t i = 0; i < WR_ARRAY_LEN(magic); i++) {
        off_t before = file_size(logpath);
        tpath(path, sizeof(path), "lk/magic");
        unlink(path);
        symlink(magic[i], path);
        id = write_small(a, path, 0, "EVIL-WRITE-THROUGH-PROC\n");
        int refused = collect(a, id, &r) == 0 && r.error && r.err_no == ELOOP &&
                      strstr(r.msg, "/proc") != NULL;
        result_free(&r);
        id = write_small(a, magic[i], 0, "EVIL-WRITE-THROUGH-PROC\n");
        refused = refused && collect(a, id, &r) == 0 && r.error && r.err_no == ELOOP;
        result_free(&r);
        ok(refused && file_size(logpath) == before,
           "a write through a symlink to %s, or to it directly: ELOOP, the log did not grow",
           magic[i]);
    }
    snprintf(buf, sizeof(buf), "/proc/%d/root/etc/hostname", (int)a->pid);
    const char *reads[] = {"/proc/self/environ", buf, "/proc/self/cwd/x"};
    for (size_t i = 0; i < WR_ARRAY_LEN(reads); i++) {
        tpath(path, sizeof(path), "lk/magic");
        unlink(path);
        symlink(reads[i], path);
        id = read_req(a, path, -1, -1);
        ok(collect(a, id, &r) == 0 && r.error && r.err_no == ELOOP && r.data.len == 0,
           "a read through a symlink to %s: ELOOP", reads[i]);
        result_free(&r);
    }
    id = read_req(a, "/proc/version", -1, -1);
    ok(collect(a, id, &r) == 0 && r.ok && r.data.len > 0, "a plain file in /proc is readable");
    result_free(&r);
}

int main(int argc, char **argv)
{
    struct agent a;
    if (harness_begin(argc, argv, &a) < 0)
        return tap_done();
    ok(agent_skip_hello(&a), "the agent says HELLO first");
    test_files_rw(&a);
    test_files_meta(&a);
    test_flow_control(&a);
    test_files_links(&a);
    harness_stop_agent(&a);
    return harness_done();
}
