/*
 * Validation of JSON request bodies with messages that name the field, so a
 * client learns exactly what to fix ("cpus: must be an integer from 1 to 2").
 * Each getter returns 0 on success (absent fields take the default), or -1
 * with err set (kind WR_E_INVALID). null is not a value: a field is given or
 * left out.
 */
#ifndef WR_API_JSONV_H
#define WR_API_JSONV_H

#include <jansson.h>
#include <stddef.h>

#include "common/err.h"

/** Parses body as one JSON object. NULL with msg set if it is not one. */
json_t *jv_parse_object(const char *body, struct wr_err *err);

/** Fails on the first member not in allowed (NULL-terminated). */
int jv_only(json_t *o, const char *const *allowed, struct wr_err *err);

/** An integer in [min, max]; absent = def. */
int jv_int(json_t *o, const char *name, long long min, long long max, long long def, long long *out,
           struct wr_err *err);

/** A number (integer or real) in (min, max]; absent = def. */
int jv_number(json_t *o, const char *name, double min_excl, double max, double def, double *out,
              struct wr_err *err);

/** A boolean; absent = def. */
int jv_bool(json_t *o, const char *name, int def, int *out, struct wr_err *err);

/** A string of at most maxlen bytes without NUL; absent = *out stays NULL. Borrowed. */
int jv_string(json_t *o, const char *name, size_t maxlen, const char **out, struct wr_err *err);

/**
 * An object whose values are strings: at most max_entries, keys non-empty, at most max_key bytes
 * and (if env_keys) without '=', values at most max_val bytes, no NUL anywhere.
 * Absent = *out stays NULL. Borrowed.
 */
int jv_string_map(json_t *o, const char *name, size_t max_entries, size_t max_key, size_t max_val,
                  int env_keys, json_t **out, struct wr_err *err);

/** An array of 1..max_items strings of at most max_len bytes, no NUL. Borrowed. */
int jv_string_array(json_t *o, const char *name, size_t max_items, size_t max_len, json_t **out,
                    struct wr_err *err);

/** Parses an octal mode string ("0644", "755") into [0, 07777]. Returns 0 or -1. */
int jv_parse_mode(const char *s, unsigned *out);

#endif
