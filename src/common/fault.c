/* Fault points for tests; see fault.h for the spec format. */
#include "common/fault.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define FAULT_MAX 32
#define FAULT_NAME_MAX 96
#define FAULT_SPEC_MAX 4096

struct fault {
    char point[FAULT_NAME_MAX];
    int err;
    int delay_ms; /* > 0: the hit sleeps this long and succeeds instead of failing */
    long left;    /* < 0: every hit */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int state; /* 0 = environment not read yet, 1 = nothing armed anywhere, 2 = armed */
static struct fault faults[FAULT_MAX];
static int nfaults;
static char file[4096];
static struct timespec file_mtime;
static off_t file_size;

static const struct {
    const char *name;
    int err;
} errnames[] = {{"EIO", EIO},       {"ENOSPC", ENOSPC},       {"EBUSY", EBUSY},
                {"ENOMEM", ENOMEM}, {"EACCES", EACCES},       {"EPERM", EPERM},
                {"ENOENT", ENOENT}, {"EAGAIN", EAGAIN},       {"EEXIST", EEXIST},
                {"EINVAL", EINVAL}, {"ETIMEDOUT", ETIMEDOUT}, {"EMFILE", EMFILE},
                {"EPIPE", EPIPE}};

static int parse_errno(const char *s)
{
    for (size_t i = 0; i < sizeof(errnames) / sizeof(errnames[0]); i++)
        if (!strcmp(s, errnames[i].name))
            return errnames[i].err;
    char *end;
    long v = strtol(s, &end, 10);
    return *s && !*end && v > 0 && v < 4096 ? (int)v : EIO;
}

/* Replaces the armed set with the entries of spec. Called under lock. */
static void parse(const char *spec)
{
    char buf[FAULT_SPEC_MAX];
    snprintf(buf, sizeof(buf), "%s", spec);
    nfaults = 0;
    char *save = NULL;
    for (char *e = strtok_r(buf, ",\n", &save); e && nfaults < FAULT_MAX;
         e = strtok_r(NULL, ",\n", &save)) {
        while (*e == ' ')
            e++;
        char *eq = strchr(e, '=');
        if (!eq || eq == e || (size_t)(eq - e) >= FAULT_NAME_MAX)
            continue;
        struct fault *f = &faults[nfaults++];
        snprintf(f->point, sizeof(f->point), "%.*s", (int)(eq - e), e);
        char *colon = strchr(eq + 1, ':');
        f->left = colon ? strtol(colon + 1, NULL, 10) : -1;
        if (colon)
            *colon = '\0';
        if (!strncmp(eq + 1, "delay", 5)) {
            f->delay_ms = atoi(eq + 6);
            f->err = 0;
        } else {
            f->delay_ms = 0;
            f->err = parse_errno(eq + 1);
        }
    }
}

/* Re-reads the file if it changed. Called under lock. */
static void reload_file(void)
{
    struct stat st;
    if (stat(file, &st) < 0) {
        nfaults = 0;
        file_size = -1;
        return;
    }
    if (st.st_size == file_size && st.st_mtim.tv_sec == file_mtime.tv_sec &&
        st.st_mtim.tv_nsec == file_mtime.tv_nsec)
        return;
    file_size = st.st_size;
    file_mtime = st.st_mtim;
    char spec[FAULT_SPEC_MAX] = "";
    FILE *f = fopen(file, "re");
    if (f) {
        size_t n = fread(spec, 1, sizeof(spec) - 1, f);
        spec[n] = '\0';
        fclose(f);
    }
    parse(spec);
}

static int matches(const struct fault *f, const char *point)
{
    size_t n = strlen(f->point);
    if (n && f->point[n - 1] == '*')
        return !strncmp(f->point, point, n - 1);
    return !strcmp(f->point, point);
}

int fault_hit(const char *point, struct wr_err *err)
{
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) == 1)
        return 0;
    pthread_mutex_lock(&lock);
    if (state == 0) {
        const char *env = getenv("WR_FAULTS");
        const char *path = getenv("WR_FAULTS_FILE");
        if (path && *path) {
            snprintf(file, sizeof(file), "%s", path);
            file_size = -1;
        }
        if (env && *env)
            parse(env);
        __atomic_store_n(&state, file[0] || nfaults ? 2 : 1, __ATOMIC_RELEASE);
    }
    if (file[0])
        reload_file();
    int rc = 0, delay_ms = 0;
    for (int i = 0; i < nfaults; i++) {
        struct fault *f = &faults[i];
        if (!matches(f, point) || f->left == 0)
            continue;
        if (f->left > 0)
            f->left--;
        if (f->delay_ms > 0)
            delay_ms = f->delay_ms;
        else
            rc = wr_err_set(err, f->err, "fault injected at %s: %s", point, strerror(f->err));
        break;
    }
    pthread_mutex_unlock(&lock);
    if (delay_ms > 0) {
        struct timespec ts = {delay_ms / 1000, (long)(delay_ms % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
            ;
    }
    if (rc < 0)
        errno = err ? err->code : EIO;
    return rc;
}

void fault_reset(void)
{
    pthread_mutex_lock(&lock);
    nfaults = 0;
    file[0] = '\0';
    __atomic_store_n(&state, 0, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&lock);
}
