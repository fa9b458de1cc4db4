/*
 * A spinner on stderr, on a terminal only (cli/spinner.c).
 */
#ifndef WR_CLI_SPINNER_H
#define WR_CLI_SPINNER_H

struct spinner;

/** Starts a spinner saying what is awaited; NULL (and nothing shown) when stderr is not a
 * terminal. */
struct spinner *spinner_start(const char *what);

/** Stops it and erases its line (NULL: nothing). */
void spinner_stop(struct spinner *s);

#endif
