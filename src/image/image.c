/*
 * Building, finding and listing sandbox images (see image.h for the layout).
 *
 * The build runs mmdebstrap into a temporary directory next to the finished
 * builds and renames it into place only when it is complete, so a crash never
 * leaves a half-built image that looks usable. The apt sources come from the
 * host's own configuration: its Debian entries for the image's suite are
 * copied into a deb822 file that mmdebstrap also installs in the image, so
 * `apt-get` inside uses the same mirror as the host. No mirror is hard-coded.
 */
#include "image/image.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/proc.h"
#include "common/util.h"

/* What an image is made of. */
struct recipe {
    const char *name;
    const char *suite;
    const char *variant;
    const char *const *packages;
};

static const char *const default_packages[] = {
    "python3",         "python3-pip",     "python3-venv", "git", "curl",
    "ca-certificates", "build-essential", "procps",       NULL,
};

static const struct recipe recipes[] = {
    {"default", "bookworm", "minbase", default_packages},
};

#define BUILD_TIMEOUT_MS (2 * 3600 * 1000)

int image_name_valid(const char *name)
{
    if (!name || !name[0] || strlen(name) > IMAGE_NAME_MAX)
        return 0;
    if (!((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9')))
        return 0;
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '_' ||
              *p == '-'))
            return 0;
    return 1;
}

static const struct recipe *recipe_find(const char *name)
{
    for (size_t i = 0; i < WR_ARRAY_LEN(recipes); i++)
        if (!strcmp(recipes[i].name, name))
            return &recipes[i];
    return NULL;
}

static int check_name(const char *state_dir, const char *name, struct wr_err *err)
{
    if (!state_dir || state_dir[0] != '/')
        return wr_err_set(err, EINVAL, "state directory must be an absolute path");
    if (strlen(state_dir) > PATH_MAX - 200)
        return wr_err_set(err, ENAMETOOLONG, "state directory path is too long");
    if (!image_name_valid(name))
        return wr_err_set(err, EINVAL, "invalid image name \"%s\" (want [a-z0-9][a-z0-9._-]{0,63})",
                          name ? name : "");
    return 0;
}

/* Prints a progress line to the build log. */
__attribute__((format(printf, 2, 3))) static void blog(int fd, const char *fmt, ...)
{
    if (fd < 0)
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    (void)write_all(fd, line, (size_t)n);
}

/* ---- reading small files ---- */

/* Reads a whole (small) file into a NUL-terminated malloc'd buffer. NULL with errno set. */
static char *read_file(const char *path, size_t max)
{
    cleanup_close int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0)
        return NULL;
    size_t cap = 4096, len = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (len + 1 >= cap) {
            if (cap >= max) {
                free(buf);
                errno = EFBIG;
                return NULL;
            }
            cap *= 2;
            buf = xrealloc(buf, cap);
        }
        ssize_t n = read(fd, buf + len, cap - len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int e = errno;
            free(buf);
            errno = e;
            return NULL;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    buf[len] = '\0';
    return buf;
}

static json_t *read_json(const char *path)
{
    cleanup_free char *text = read_file(path, 1 << 20);
    if (!text)
        return NULL;
    return json_loads(text, 0, NULL);
}

/* ---- the host's apt sources ---- */

struct strbuf {
    char *s;
    size_t len, cap;
};

static void sb_add(struct strbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_addf(struct strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_addf(struct strbuf *b, const char *fmt, ...)
{
    char tmp[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n > 0)
        sb_add(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* One apt source entry, already restricted to the suites we want. */
struct source {
    char uris[1024];
    char suites[256];
    char components[256];
    struct strbuf signed_by; /* may span lines (an embedded key) */
};

static bool suite_wanted(const char *s, const char *suite)
{
    size_t n = strlen(suite);
    if (strncmp(s, suite, n))
        return false;
    return s[n] == '\0' || !strcmp(s + n, "-updates") || !strcmp(s + n, "-security");
}

/* Keeps only the wanted words of a whitespace-separated suite list. */
static void filter_suites(const char *in, const char *suite, char *out, size_t outlen)
{
    out[0] = '\0';
    char copy[512];
    snprintf(copy, sizeof(copy), "%s", in);
    char *save = NULL;
    for (char *w = strtok_r(copy, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        if (!suite_wanted(w, suite))
            continue;
        size_t len = strlen(out);
        snprintf(out + len, outlen - len, "%s%s", len ? " " : "", w);
    }
}

static void emit_source(struct strbuf *out, const struct source *src)
{
    sb_addf(out, "Types: deb\nURIs: %s\nSuites: %s\nComponents: %s\n", src->uris, src->suites,
            src->components[0] ? src->components : "main");
    if (src->signed_by.len)
        sb_addf(out, "Signed-By:%s%s\n", src->signed_by.s[0] == '\n' ? "" : " ", src->signed_by.s);
    sb_add(out, "\n", 1);
}

static char *trim(char *s)
{
    while (*s == ' ' || *s == '\t')
        s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        s[--n] = '\0';
    return s;
}

/* Parses one-line-style sources ("deb [opts] uri suite components..."). */
static int parse_list(char *text, const char *suite, struct strbuf *out)
{
    int found = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        line = trim(line);
        if (strncmp(line, "deb ", 4) && strncmp(line, "deb\t", 4))
            continue;
        line = trim(line + 3);
        struct source src;
        memset(&src, 0, sizeof(src));
        if (*line == '[') {
            char *end = strchr(line, ']');
            if (!end)
                continue;
            *end = '\0';
            char *osave = NULL;
            for (char *o = strtok_r(line + 1, " \t", &osave); o; o = strtok_r(NULL, " \t", &osave))
                if (!strncmp(o, "signed-by=", 10))
                    sb_add(&src.signed_by, o + 10, strlen(o + 10));
            line = trim(end + 1);
        }
        char *wsave = NULL;
        char *uri = strtok_r(line, " \t", &wsave);
        char *s = strtok_r(NULL, " \t", &wsave);
        if (!uri || !s || !suite_wanted(s, suite)) {
            free(src.signed_by.s);
            continue;
        }
        snprintf(src.uris, sizeof(src.uris), "%s", uri);
        snprintf(src.suites, sizeof(src.suites), "%s", s);
        for (char *c = strtok_r(NULL, " \t", &wsave); c; c = strtok_r(NULL, " \t", &wsave)) {
            size_t len = strlen(src.components);
            snprintf(src.components + len, sizeof(src.components) - len, "%s%s", len ? " " : "", c);
        }
        emit_source(out, &src);
        free(src.signed_by.s);
        found++;
    }
    return found;
}

/* Parses deb822-style sources (stanzas of "Field: value" with continuation lines). */
static int parse_deb822(char *text, const char *suite, struct strbuf *out)
{
    int found = 0;
    char *p = text;
    while (*p) {
        struct source src;
        memset(&src, 0, sizeof(src));
        char types[256] = "", suites[256] = "", enabled[16] = "yes";
        bool in_signed = false, any = false;
        /* One stanza: up to a blank line. */
        while (*p) {
            char *nl = strchr(p, '\n');
            size_t n = nl ? (size_t)(nl - p) : strlen(p);
            char line[4096];
            snprintf(line, sizeof(line), "%.*s", (int)(n < sizeof(line) ? n : sizeof(line) - 1), p);
            p += n + (nl ? 1 : 0);
            if (line[0] == '#')
                continue;
            if (!trim(line)[0] && line[0] != ' ' && line[0] != '\t') {
                if (any)
                    break;
                continue;
            }
            if (line[0] == ' ' || line[0] == '\t') {
                if (in_signed) {
                    sb_add(&src.signed_by, "\n", 1);
                    sb_add(&src.signed_by, line, strlen(line));
                }
                continue;
            }
            any = true;
            in_signed = false;
            char *colon = strchr(line, ':');
            if (!colon)
                continue;
            *colon = '\0';
            char *key = trim(line), *val = trim(colon + 1);
            if (!strcasecmp(key, "Types"))
                snprintf(types, sizeof(types), "%s", val);
            else if (!strcasecmp(key, "URIs"))
                snprintf(src.uris, sizeof(src.uris), "%s", val);
            else if (!strcasecmp(key, "Suites"))
                snprintf(suites, sizeof(suites), "%s", val);
            else if (!strcasecmp(key, "Components"))
                snprintf(src.components, sizeof(src.components), "%s", val);
            else if (!strcasecmp(key, "Enabled"))
                snprintf(enabled, sizeof(enabled), "%s", val);
            else if (!strcasecmp(key, "Signed-By")) {
                sb_add(&src.signed_by, val, strlen(val));
                in_signed = true;
            }
        }
        bool deb = false;
        char tcopy[256];
        snprintf(tcopy, sizeof(tcopy), "%s", types);
        char *tsave = NULL;
        for (char *t = strtok_r(tcopy, " \t", &tsave); t; t = strtok_r(NULL, " \t", &tsave))
            deb |= !strcmp(t, "deb");
        filter_suites(suites, suite, src.suites, sizeof(src.suites));
        if (deb && src.uris[0] && src.suites[0] && strcasecmp(enabled, "no")) {
            emit_source(out, &src);
            found++;
        }
        free(src.signed_by.s);
    }
    return found;
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

static int name_cmp(const struct dirent **a, const struct dirent **b)
{
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Collects the host's Debian entries for suite (and its -updates and -security) as deb822
 * text in *out. Returns the number of entries, or -1 with err set if there are none. */
static int host_sources(const char *suite, struct strbuf *out, char *files, size_t fileslen,
                        struct wr_err *err)
{
    int found = 0;
    files[0] = '\0';
    char *text = read_file("/etc/apt/sources.list", 1 << 20);
    if (text) {
        int n = parse_list(text, suite, out);
        if (n > 0)
            snprintf(files + strlen(files), fileslen - strlen(files), "%s/etc/apt/sources.list",
                     files[0] ? ", " : "");
        found += n;
        free(text);
    }
    struct dirent **ents = NULL;
    int n = scandir("/etc/apt/sources.list.d", &ents, NULL, name_cmp);
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        bool list = has_suffix(nm, ".list"), d822 = has_suffix(nm, ".sources");
        if (nm[0] != '.' && (list || d822)) {
            char path[PATH_MAX];
            snprintf(path, sizeof(path), "/etc/apt/sources.list.d/%s", nm);
            text = read_file(path, 1 << 20);
            if (text) {
                int k = list ? parse_list(text, suite, out) : parse_deb822(text, suite, out);
                if (k > 0)
                    snprintf(files + strlen(files), fileslen - strlen(files), "%s%s",
                             files[0] ? ", " : "", path);
                found += k;
                free(text);
            }
        }
        free(ents[i]);
    }
    free(ents);
    if (found == 0)
        return wr_err_set(err, ENOENT,
                          "the host's apt sources (/etc/apt/sources.list, "
                          "/etc/apt/sources.list.d/) have no Debian %s entry to build the image "
                          "from; add one for your mirror",
                          suite);
    return found;
}

/* ---- sizes ---- */

struct du_state {
    uint64_t bytes;
    struct {
        dev_t dev;
        ino_t ino;
    } * seen;
    size_t nseen, capseen;
};

static _Thread_local struct du_state *du_cur;

static int du_visit(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)path;
    (void)ftw;
    if (flag == FTW_NS)
        return 0;
    struct du_state *d = du_cur;
    if (st->st_nlink > 1 && !S_ISDIR(st->st_mode)) {
        for (size_t i = 0; i < d->nseen; i++)
            if (d->seen[i].dev == st->st_dev && d->seen[i].ino == st->st_ino)
                return 0;
        if (d->nseen == d->capseen) {
            d->capseen = d->capseen ? d->capseen * 2 : 64;
            d->seen = xrealloc(d->seen, d->capseen * sizeof(*d->seen));
        }
        d->seen[d->nseen].dev = st->st_dev;
        d->seen[d->nseen].ino = st->st_ino;
        d->nseen++;
    }
    d->bytes += (uint64_t)st->st_blocks * 512;
    return 0;
}

/* Disk use of a tree (hard links counted once, not crossing mounts). */
static uint64_t disk_usage(const char *path)
{
    struct du_state d = {0};
    du_cur = &d;
    nftw(path, du_visit, 32, FTW_PHYS | FTW_MOUNT);
    du_cur = NULL;
    free(d.seen);
    return d.bytes;
}

/* ---- removing a failed or stale build ---- */

static int rm_visit(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

/* Removes a build directory we created (trusted content: mmdebstrap's output). */
static void remove_build_dir(const char *path)
{
    nftw(path, rm_visit, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* ---- paths ---- */

struct img_paths {
    char dir[PATH_MAX];    /* images/<name> */
    char builds[PATH_MAX]; /* images/<name>/builds */
    char link[PATH_MAX];   /* images/<name>/rootfs */
    char lock[PATH_MAX];   /* images/<name>/.lock */
};

static void img_paths(const char *state_dir, const char *name, struct img_paths *p)
{
    snprintf(p->dir, sizeof(p->dir), "%s/images/%s", state_dir, name);
    snprintf(p->builds, sizeof(p->builds), "%s/builds", p->dir);
    snprintf(p->link, sizeof(p->link), "%s/rootfs", p->dir);
    snprintf(p->lock, sizeof(p->lock), "%s/.lock", p->dir);
}

static int mkdir_one(const char *p, mode_t mode, struct wr_err *err)
{
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        return wr_err_sys(err, errno, "creating %s", p);
    return 0;
}

/* Resolves the current build. Returns 0 with out = .../builds/<b>/rootfs and meta =
 * .../builds/<b>/image.json (either may be NULL), or -1 with errno-style code in err. */
static int current_build(const char *state_dir, const char *name, char *out, size_t outlen,
                         char *meta, size_t metalen, struct wr_err *err)
{
    struct img_paths p;
    img_paths(state_dir, name, &p);
    char real[PATH_MAX];
    if (!realpath(p.link, real) && !recipe_find(name))
        return wr_err_set(err, ENOENT,
                          "there is no image named '%s'; the images this daemon can run are its "
                          "built-in ones (default)",
                          name);
    if (!realpath(p.link, real))
        return wr_err_set(err, ENOENT, "image %s is not built; run `withruntime image build%s%s`",
                          name, strcmp(name, "default") ? " " : "",
                          strcmp(name, "default") ? name : "");
    struct stat st;
    char m[PATH_MAX + 16];
    snprintf(m, sizeof(m), "%s", real);
    char *slash = strrchr(m, '/');
    snprintf(slash + 1, sizeof(m) - (size_t)(slash + 1 - m), "image.json");
    if (stat(real, &st) < 0 || !S_ISDIR(st.st_mode) || access(m, R_OK) < 0)
        return wr_err_set(err, ENOENT,
                          "image %s is not built completely; run `withruntime image build "
                          "--force%s%s`",
                          name, strcmp(name, "default") ? " " : "",
                          strcmp(name, "default") ? name : "");
    if (out && snprintf(out, outlen, "%s", real) >= (int)outlen)
        return wr_err_set(err, ENAMETOOLONG, "image path is too long");
    if (meta)
        snprintf(meta, metalen, "%s", m);
    return 0;
}

int image_rootfs(const char *state_dir, const char *name, char *out, size_t outlen,
                 struct wr_err *err)
{
    if (check_name(state_dir, name, err) < 0)
        return -1;
    return current_build(state_dir, name, out, outlen, NULL, 0, err);
}

/* ---- building ---- */

/* Runs argv with stdout and stderr copied to log_fd; keeps the last output line for the
 * error message. Returns 0 or -1. */
/* mmdebstrap's stage lines (Debian 12's mmdebstrap 1.3), how far a build is when each starts
 * (measured on the default recipe: most of the time goes to installing packages), and the
 * stage in a user's words. */
static const struct {
    const char *prefix;
    int permille;
    const char *words;
} stages[] = {
    {"I: running apt-get update", 20, "reading the package lists"},
    {"I: downloading packages", 80, "downloading packages"},
    {"I: extracting archives", 250, "unpacking the base system"},
    {"I: installing essential packages", 330, "installing the base system"},
    {"I: installing remaining packages", 450, "installing python, git and the build tools"},
    {"I: running --customize-hook", 930, "finishing the image"},
    {"I: cleaning package lists", 960, "cleaning up"},
    {"I: success", 990, "copying into place"},
};

int image_stage_of(const char *line, int *permille, const char **words)
{
    for (size_t i = 0; i < sizeof(stages) / sizeof(stages[0]); i++)
        if (strncmp(line, stages[i].prefix, strlen(stages[i].prefix)) == 0) {
            *permille = stages[i].permille;
            *words = stages[i].words;
            return 1;
        }
    return 0;
}

int64_t image_eta_ms(uint64_t elapsed_ms, int permille, uint64_t prev_ms)
{
    if (prev_ms > 0)
        return elapsed_ms < prev_ms ? (int64_t)(prev_ms - elapsed_ms) : 0;
    if (permille < 50 || elapsed_ms < 2000)
        return -1;
    uint64_t total = elapsed_ms * 1000 / (uint64_t)permille;
    return total > elapsed_ms ? (int64_t)(total - elapsed_ms) : 0;
}

struct build_watch {
    const struct image_progress *pr;
    uint64_t t0, prev_ms;
    int permille;
    const char *stage;
    char line[1024];
    size_t len;
};

static void report(struct build_watch *w)
{
    if (w->pr && w->pr->fn)
        w->pr->fn(w->pr->arg, w->permille, w->stage,
                  image_eta_ms(now_ms_monotonic() - w->t0, w->permille, w->prev_ms));
}

/* Feeds mmdebstrap's output to the watcher a line at a time (long lines cut). */
static void watch_bytes(struct build_watch *w, const char *buf, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != '\n') {
            if (w->len < sizeof(w->line) - 1)
                w->line[w->len++] = buf[i];
            continue;
        }
        w->line[w->len] = '\0';
        w->len = 0;
        int pm;
        const char *words;
        if (image_stage_of(w->line, &pm, &words) && pm > w->permille) {
            w->permille = pm;
            w->stage = words;
            report(w);
        }
    }
}

/* Runs argv with its output (both streams) to log_fd, keeping the tail for the error; w (may
 * be NULL) watches the output for progress and is told about twice a second. */
static int run_logged(char *const argv[], int log_fd, struct build_watch *w, struct wr_err *err)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return wr_err_sys(err, errno, "pipe");
    cleanup_close int rfd = pfd[0];
    pid_t pid = proc_spawn(argv, NULL, -1, pfd[1], pfd[1], err);
    close(pfd[1]);
    if (pid < 0)
        return -1;
    char tail[512];
    size_t tail_len = 0;
    uint64_t last_report = now_ms_monotonic();
    for (;;) {
        struct pollfd pf = {.fd = rfd, .events = POLLIN};
        int pr = poll(&pf, 1, w ? 500 : -1);
        if (pr < 0 && errno != EINTR)
            break;
        if (w && now_ms_monotonic() - last_report >= 500) {
            report(w);
            last_report = now_ms_monotonic();
        }
        if (pr <= 0)
            continue;
        char buf[8192];
        ssize_t n = read(rfd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (log_fd >= 0)
            (void)write_all(log_fd, buf, (size_t)n);
        if (w)
            watch_bytes(w, buf, (size_t)n);
        size_t k = (size_t)n;
        if (k >= sizeof(tail)) {
            memcpy(tail, buf + k - sizeof(tail), sizeof(tail));
            tail_len = sizeof(tail);
        } else {
            size_t keep = sizeof(tail) - k < tail_len ? sizeof(tail) - k : tail_len;
            memmove(tail, tail + tail_len - keep, keep);
            memcpy(tail + keep, buf, k);
            tail_len = keep + k;
        }
    }
    int status = 0;
    if (proc_wait(pid, &status, BUILD_TIMEOUT_MS, err) < 0)
        return wr_err_prefix(err, "%s", argv[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    while (tail_len > 0 && (tail[tail_len - 1] == '\n' || tail[tail_len - 1] == ' '))
        tail_len--;
    size_t start = tail_len;
    while (start > 0 && tail[start - 1] != '\n')
        start--;
    if (WIFEXITED(status))
        return wr_err_set(err, EIO, "%s exited with status %d: %.*s", argv[0], WEXITSTATUS(status),
                          (int)(tail_len - start), tail + start);
    return wr_err_set(err, EIO, "%s was killed by signal %d", argv[0], WTERMSIG(status));
}

static int write_text(const char *path, const char *text, struct wr_err *err)
{
    cleanup_close int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return wr_err_sys(err, errno, "creating %s", path);
    if (write_all(fd, text, strlen(text)) < 0 || fsync(fd) < 0)
        return wr_err_sys(err, errno, "writing %s", path);
    return 0;
}

static int write_metadata(const char *path, const struct recipe *r, const char *build,
                          int64_t created, uint64_t size, const char *sources_from,
                          uint64_t build_ms, struct wr_err *err)
{
    char ts[32];
    format_rfc3339(created, ts, sizeof(ts));
    json_t *pk = json_array();
    for (const char *const *p = r->packages; *p; p++)
        json_array_append_new(pk, json_string(*p));
    json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s, s:o, s:I, s:s, s:s, s:I}", "name",
                          r->name, "build", build, "created_at", (json_int_t)created, "created", ts,
                          "suite", r->suite, "variant", r->variant, "packages", pk, "size_bytes",
                          (json_int_t)size, "sources_from", sources_from, "builder", "mmdebstrap",
                          "build_ms", (json_int_t)build_ms);
    if (!j)
        return wr_err_set(err, ENOMEM, "building image metadata");
    cleanup_free char *text = json_dumps(j, JSON_INDENT(2));
    json_decref(j);
    if (!text)
        return wr_err_set(err, ENOMEM, "serialising image metadata");
    return write_text(path, text, err);
}

/* Points images/<name>/rootfs at builds/<build>/rootfs, atomically. */
static int swap_link(const struct img_paths *p, const char *build, struct wr_err *err)
{
    char target[PATH_MAX], tmp[PATH_MAX + 16];
    snprintf(target, sizeof(target), "builds/%s/rootfs", build);
    snprintf(tmp, sizeof(tmp), "%s.new", p->link);
    unlink(tmp);
    if (symlink(target, tmp) < 0)
        return wr_err_sys(err, errno, "creating %s", tmp);
    if (rename(tmp, p->link) < 0) {
        int e = errno;
        unlink(tmp);
        return wr_err_sys(err, e, "renaming %s", tmp);
    }
    return 0;
}

/* Removes unfinished builds (".tmp-*") left by a crash. Called with the lock held. */
static void remove_stale_tmp(const struct img_paths *p, int log_fd)
{
    DIR *d = opendir(p->builds);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strncmp(de->d_name, ".tmp-", 5))
            continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof(path), "%s/%s", p->builds, de->d_name);
        blog(log_fd, "image: removing the unfinished build %s", path);
        remove_build_dir(path);
    }
    closedir(d);
}

int image_build(const char *state_dir, const char *name, int force, int log_fd, struct wr_err *err)
{
    return image_build_progress(state_dir, name, force, log_fd, NULL, err);
}

int image_build_progress(const char *state_dir, const char *name, int force, int log_fd,
                         const struct image_progress *pr, struct wr_err *err)
{
    if (check_name(state_dir, name, err) < 0)
        return -1;
    const struct recipe *r = recipe_find(name);
    if (!r)
        return wr_err_set(err, ENOENT, "no recipe for image \"%s\" (only \"default\" can be built)",
                          name);
    struct img_paths p;
    img_paths(state_dir, name, &p);
    char images[PATH_MAX];
    snprintf(images, sizeof(images), "%s/images", state_dir);
    if (mkdir_one(state_dir, 0755, err) < 0 || mkdir_one(images, 0755, err) < 0 ||
        mkdir_one(p.dir, 0755, err) < 0 || mkdir_one(p.builds, 0755, err) < 0)
        return -1;

    cleanup_close int lock = open(p.lock, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (lock < 0)
        return wr_err_sys(err, errno, "opening %s", p.lock);
    if (flock(lock, LOCK_EX | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK)
            return wr_err_sys(err, errno, "locking %s", p.lock);
        blog(log_fd, "image %s: another build is running; waiting for it", name);
        while (flock(lock, LOCK_EX) < 0)
            if (errno != EINTR)
                return wr_err_sys(err, errno, "locking %s", p.lock);
    }
    /* The lock is released when `lock` is closed. */

    remove_stale_tmp(&p, log_fd);
    char cur[PATH_MAX], cur_meta[PATH_MAX];
    if (current_build(state_dir, name, cur, sizeof(cur), cur_meta, sizeof(cur_meta), NULL) < 0)
        cur[0] = cur_meta[0] = '\0';
    if (!force && cur[0]) {
        blog(log_fd, "image %s is already built (%s); use --force to rebuild", name, cur);
        return 0;
    }

    struct strbuf sources = {0};
    char sources_from[1024];
    if (host_sources(r->suite, &sources, sources_from, sizeof(sources_from), err) < 0)
        return -1;

    int64_t created = now_unix();
    char build[64];
    struct tm tm;
    time_t t = (time_t)created;
    gmtime_r(&t, &tm);
    strftime(build, sizeof(build), "%Y%m%dT%H%M%SZ", &tm);
    char final_dir[PATH_MAX + 128], tmp_dir[PATH_MAX + 128];
    snprintf(final_dir, sizeof(final_dir), "%s/%s", p.builds, build);
    for (int i = 1; access(final_dir, F_OK) == 0 && i < 100; i++) {
        snprintf(build + 16, sizeof(build) - 16, "-%d", i);
        snprintf(final_dir, sizeof(final_dir), "%s/%s", p.builds, build);
    }
    snprintf(tmp_dir, sizeof(tmp_dir), "%s/.tmp-%s", p.builds, build);
    if (mkdir(tmp_dir, 0755) < 0) {
        free(sources.s);
        return wr_err_sys(err, errno, "creating %s", tmp_dir);
    }

    int ret = -1;
    char src_file[PATH_MAX + 160], target[PATH_MAX + 160], meta[PATH_MAX + 160];
    snprintf(src_file, sizeof(src_file), "%s/debian.sources", tmp_dir);
    snprintf(target, sizeof(target), "%s/rootfs", tmp_dir);
    snprintf(meta, sizeof(meta), "%s/image.json", tmp_dir);
    if (write_text(src_file, sources.s, err) < 0)
        goto out;

    char include[1024] = "--include=";
    for (const char *const *pk = r->packages; *pk; pk++)
        snprintf(include + strlen(include), sizeof(include) - strlen(include), "%s%s",
                 pk == r->packages ? "" : ",", *pk);
    char variant[64];
    snprintf(variant, sizeof(variant), "--variant=%s", r->variant);
    char *argv[] = {"mmdebstrap", variant, include,
                    /* The host's resolver and name mean nothing inside a sandbox. */
                    "--customize-hook=mkdir -p \"$1/workspace\" && : > \"$1/etc/resolv.conf\" "
                    "&& echo sandbox > \"$1/etc/hostname\"",
                    "--", (char *)r->suite, target, src_file, NULL};
    blog(log_fd, "image %s: building Debian %s (%s) into %s with sources from %s", name, r->suite,
         include + 10, final_dir, sources_from);
    uint64_t t0 = now_ms_monotonic();
    struct build_watch watch = {.pr = pr, .t0 = t0, .stage = "starting"};
    if (cur_meta[0]) { /* the last build of this image is the estimate */
        json_t *prev = read_json(cur_meta);
        json_t *ms = json_object_get(prev, "build_ms");
        if (json_is_integer(ms) && json_integer_value(ms) > 0)
            watch.prev_ms = (uint64_t)json_integer_value(ms);
        json_decref(prev);
    }
    report(&watch);
    if (run_logged(argv, log_fd, pr ? &watch : NULL, err) < 0) {
        wr_err_prefix(err, "building image %s", name);
        goto out;
    }
    uint64_t size = disk_usage(target);
    if (write_metadata(meta, r, build, created, size, sources_from, now_ms_monotonic() - t0, err) <
        0)
        goto out;
    if (rename(tmp_dir, final_dir) < 0) {
        wr_err_sys(err, errno, "renaming %s", tmp_dir);
        goto out;
    }
    tmp_dir[0] = '\0';
    if (swap_link(&p, build, err) < 0)
        goto out;
    watch.permille = 1000;
    watch.stage = "done";
    report(&watch);
    blog(log_fd, "image %s: built in %.1f s, %.0f MB, at %s/rootfs", name,
         (double)(now_ms_monotonic() - t0) / 1000.0, (double)size / 1e6, final_dir);
    if (cur[0] && force)
        blog(log_fd,
             "image %s: the previous build %s is kept for the sandboxes created from "
             "it; remove it once none is left",
             name, cur);
    ret = 0;
out:
    if (tmp_dir[0])
        remove_build_dir(tmp_dir);
    free(sources.s);
    return ret;
}

/* ---- listing ---- */

int image_list(const char *state_dir, image_list_cb cb, void *arg, struct wr_err *err)
{
    if (!state_dir || state_dir[0] != '/')
        return wr_err_set(err, EINVAL, "state directory must be an absolute path");
    char images[PATH_MAX];
    snprintf(images, sizeof(images), "%s/images", state_dir);
    struct dirent **ents = NULL;
    int n = scandir(images, &ents, NULL, name_cmp);
    if (n < 0)
        return errno == ENOENT ? 0 : wr_err_sys(err, errno, "reading %s", images);
    int ret = 0;
    for (int i = 0; i < n; i++) {
        const char *nm = ents[i]->d_name;
        char meta[PATH_MAX];
        if (ret == 0 && image_name_valid(nm) &&
            current_build(state_dir, nm, NULL, 0, meta, sizeof(meta), NULL) == 0) {
            json_t *j = read_json(meta);
            json_int_t size = 0, created = 0;
            if (j &&
                json_unpack(j, "{s:I, s:I}", "size_bytes", &size, "created_at", &created) == 0) {
                struct image_info info;
                memset(&info, 0, sizeof(info));
                snprintf(info.name, sizeof(info.name), "%s", nm);
                info.size_bytes = (uint64_t)size;
                info.created_at = (int64_t)created;
                ret = cb(arg, &info);
            }
            json_decref(j);
        }
        free(ents[i]);
    }
    free(ents);
    return ret;
}
