/*
 * Host files a sandbox can make grow: its agent.log (the agent's stderr, and runsc's) is
 * written by the agent at the sandbox's prompting, through a descriptor that runsc holds open
 * with O_APPEND. The daemon caps it from time to time: past its limit the file is cut in
 * place down to its newest lines, behind a marker line, and writers go on appending at the
 * new end.
 */
#ifndef WR_DRIVER_LOGCAP_H
#define WR_DRIVER_LOGCAP_H

#include <stdint.h>

#include "common/err.h"

/**
 * If dir/agent.log is larger than max bytes, keeps its last keep bytes (from a line start)
 * after a marker line and drops the rest; *dropped (may be NULL) gets the bytes dropped.
 * Lines written while it is cut may be lost. No file, or small enough: nothing to do.
 * Returns 1 if it cut the file, 0 if not, -1 with err set.
 */
int driver_log_cap(const char *dir, uint64_t max, uint64_t keep, uint64_t *dropped,
                   struct wr_err *err);

#endif
