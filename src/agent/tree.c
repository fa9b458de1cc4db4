/*
 * Signalling a command's whole process tree. A process group is not enough:
 * anything can setsid() or setpgid() away, and a daemon's timeout must still
 * end it. So the tree is found by walking /proc parent links, and for SIGKILL
 * it is first frozen with SIGSTOP (a stopped process cannot fork, and its
 * children keep their parent link) so nothing escapes by forking or by being
 * re-parented to us while the kill is under way.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent.h"
#include "common/util.h"

/* Rounds of "find new processes, stop them" before killing; then rounds of "kill survivors". */
#define FREEZE_ROUNDS 16
#define KILL_ROUNDS 50

struct pinfo {
    pid_t pid, ppid, pgrp, sid;
    char state;
    signed char mark; /* 0 unknown, 1 in the tree, -1 not */
};

struct ptable {
    struct pinfo *p;
    size_t n, cap;
};

/* Parses /proc/<pid>/stat: "pid (comm) state ppid pgrp session ...", where comm may itself
 * contain spaces and parentheses, hence the search for the last ')'. */
static int read_stat(pid_t pid, struct pinfo *out)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read_full(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return -1;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp)
        return -1;
    char state;
    int ppid, pgrp, sid;
    if (sscanf(rp + 1, " %c %d %d %d", &state, &ppid, &pgrp, &sid) != 4)
        return -1;
    *out = (struct pinfo){.pid = pid, .ppid = ppid, .pgrp = pgrp, .sid = sid, .state = state};
    return 0;
}

static int cmp_pid(const void *a, const void *b)
{
    pid_t x = ((const struct pinfo *)a)->pid, y = ((const struct pinfo *)b)->pid;
    return (x > y) - (x < y);
}

static int scan(struct ptable *t)
{
    t->n = 0;
    DIR *d = opendir("/proc");
    if (!d)
        return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!isdigit((unsigned char)e->d_name[0]))
            continue;
        struct pinfo pi;
        if (read_stat((pid_t)atoi(e->d_name), &pi) < 0)
            continue; /* gone meanwhile */
        if (t->n == t->cap) {
            t->cap = t->cap ? t->cap * 2 : 256;
            t->p = xrealloc(t->p, t->cap * sizeof(*t->p));
        }
        t->p[t->n++] = pi;
    }
    closedir(d);
    qsort(t->p, t->n, sizeof(*t->p), cmp_pid);
    return 0;
}

static struct pinfo *lookup(struct ptable *t, pid_t pid)
{
    struct pinfo key = {.pid = pid};
    return bsearch(&key, t->p, t->n, sizeof(*t->p), cmp_pid);
}

/*
 * Marks every process that belongs to the tree: root's descendants and the members of
 * `group` (as process group or session) with their descendants. Each chain of parents is walked
 * once and the answer memoised, so this stays O(n log n) even for deep chains.
 */
static void mark_tree(struct ptable *t, pid_t root, pid_t group)
{
    size_t *stack = xmalloc((t->n + 1) * sizeof(*stack));
    for (size_t i = 0; i < t->n; i++)
        t->p[i].mark = 0;
    for (size_t i = 0; i < t->n; i++) {
        size_t depth = 0;
        struct pinfo *p = &t->p[i];
        signed char m = 0;
        while (p && p->mark == 0) {
            if (p->pid == root || (group > 0 && (p->pgrp == group || p->sid == group))) {
                m = 1;
                break;
            }
            stack[depth++] = (size_t)(p - t->p);
            p->mark = -2; /* on the current path: a cycle (pid reuse race) ends here */
            struct pinfo *parent = p->ppid > 0 ? lookup(t, p->ppid) : NULL;
            p = parent;
        }
        if (m == 0)
            m = (p && p->mark == 1) ? 1 : -1;
        if (p && p->mark == 0)
            p->mark = m;
        while (depth > 0)
            t->p[stack[--depth]].mark = m;
    }
    free(stack);
}

/* A target is a live member of the tree other than ourselves and the commands' namespace init
 * (killing that would kill every command). */
static int is_target(const struct pinfo *p)
{
    return p->mark == 1 && p->pid != ag.pid && p->pid != 1 && p->pid != ag.holder &&
           p->state != 'Z' && p->state != 'X';
}

static int pid_in(const pid_t *set, size_t n, pid_t pid)
{
    for (size_t i = 0; i < n; i++)
        if (set[i] == pid)
            return 1;
    return 0;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    nanosleep(&ts, NULL);
}

static void kill_group(pid_t group, int sig)
{
    if (group > 1 && group != ag.pid)
        kill(-group, sig);
}

void tree_signal(pid_t root, pid_t group, int sig)
{
    struct ptable t = {0};
    if (sig != SIGKILL) {
        /* Look before signalling: a parent that dies of this signal would orphan its children
         * out of the tree before a later scan could find them. */
        int scanned = scan(&t) == 0;
        if (scanned)
            mark_tree(&t, root, group);
        kill_group(group, sig);
        for (size_t i = 0; scanned && i < t.n; i++)
            if (is_target(&t.p[i]))
                kill(t.p[i].pid, sig);
        free(t.p);
        return;
    }

    /* Freeze: stop everything found, look again, until a round finds nothing new. The set of
     * stopped pids stays small in practice; a linear check keeps this simple. */
    pid_t *stopped = NULL;
    size_t nstopped = 0, capstopped = 0;
    kill_group(group, SIGSTOP);
    for (int round = 0; round < FREEZE_ROUNDS; round++) {
        if (scan(&t) < 0)
            break;
        mark_tree(&t, root, group);
        size_t fresh = 0;
        for (size_t i = 0; i < t.n; i++) {
            if (!is_target(&t.p[i]) || pid_in(stopped, nstopped, t.p[i].pid))
                continue;
            kill(t.p[i].pid, SIGSTOP);
            if (nstopped == capstopped) {
                capstopped = capstopped ? capstopped * 2 : 64;
                stopped = xrealloc(stopped, capstopped * sizeof(*stopped));
            }
            stopped[nstopped++] = t.p[i].pid;
            fresh++;
        }
        if (!fresh)
            break;
    }
    kill_group(group, SIGKILL);
    for (size_t i = 0; i < nstopped; i++)
        kill(stopped[i], SIGKILL);
    free(stopped);

    /* Whatever is still alive and still reachable (anything forked in a race) is killed again. */
    for (int round = 0; round < KILL_ROUNDS; round++) {
        if (scan(&t) < 0)
            break;
        mark_tree(&t, root, group);
        size_t left = 0;
        for (size_t i = 0; i < t.n; i++) {
            if (!is_target(&t.p[i]))
                continue;
            kill(t.p[i].pid, SIGKILL);
            left++;
        }
        if (!left)
            break;
        sleep_ms(1);
    }
    free(t.p);
}

int tree_count_others(void)
{
    struct ptable t = {0};
    if (scan(&t) < 0)
        return -1;
    mark_tree(&t, ag.pid, 0);
    int n = 0;
    for (size_t i = 0; i < t.n; i++)
        n += t.p[i].mark == 1 && t.p[i].pid != ag.pid && t.p[i].pid != ag.holder;
    free(t.p);
    return n;
}
