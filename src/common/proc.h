/*
 * Child processes in a daemon that is a child subreaper: one reaper thread
 * collects every child that exits (ours and orphans re-parented to us), and
 * callers wait for the pids they started.
 */
#ifndef WR_COMMON_PROC_H
#define WR_COMMON_PROC_H

#include <sys/types.h>

#include "common/err.h"

/**
 * Makes this process a child subreaper and starts the reaper thread. Call once, before any
 * proc_spawn. After this, nothing else in the process may call wait()/waitpid() directly.
 */
int proc_reaper_start(struct wr_err *err);

/** Stops the reaper thread (for clean shutdown in tests). */
void proc_reaper_stop(void);

/**
 * Starts argv[0] (a path, or a name looked up in PATH) with the given fds as its stdin, stdout
 * and stderr (-1 = /dev/null) and every other fd closed. env NULL = inherit.
 * Returns the pid, or -1 with err set.
 */
pid_t proc_spawn(char *const argv[], char *const env[], int fd_in, int fd_out, int fd_err,
                 struct wr_err *err);

/* Descriptors proc_spawn_keep passes on at most. */
#define PROC_KEEP_MAX 8

/**
 * proc_spawn, and keep[0..nkeep) become the child's fds 3, 4, ... (every other one closed).
 */
pid_t proc_spawn_keep(char *const argv[], char *const env[], int fd_in, int fd_out, int fd_err,
                      const int *keep, int nkeep, struct wr_err *err);

/**
 * Waits for a pid started by proc_spawn. timeout_ms < 0 waits forever. On timeout the process
 * is sent SIGKILL and waited for. Stores the wait status in *status.
 * Returns 0, or -1 with err set (on timeout: code ETIMEDOUT, after the kill).
 */
int proc_wait(pid_t pid, int *status, int timeout_ms, struct wr_err *err);

/**
 * Runs argv to completion (stdin /dev/null), capturing up to 64 KiB of combined stdout and
 * stderr into out (NUL-terminated; out may be NULL). Returns 0 if it exited 0; -1 with err set
 * otherwise (the message names the command and includes the captured output's last line).
 */
int proc_run(char *const argv[], int timeout_ms, char *out, size_t outlen, struct wr_err *err);

#endif
