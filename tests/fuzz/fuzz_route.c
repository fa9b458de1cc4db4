/*
 * Fuzz target: route matching on arbitrary method and path bytes. Input:
 * method, a NUL byte, then the path.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http/router.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const struct route routes[] = {
    {"GET", "/v1/health", 0, NULL},
    {"POST", "/v1/sandboxes", 1, NULL},
    {"GET", "/v1/sandboxes/{id}", 2, NULL},
    {"DELETE", "/v1/sandboxes/{id}", 3, NULL},
    {"POST", "/v1/sandboxes/{id}/exec", 4, NULL},
    {"GET", "/v1/sandboxes/{id}/files/content", 5, NULL},
    {"PUT", "/v1/sandboxes/{id}/files/content", 6, NULL},
    {"DELETE", "/v1/sandboxes/{id}/files", 7, NULL},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *buf = malloc(size + 2);
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    buf[size + 1] = '\0';
    const char *method = buf;
    const char *path = buf + strlen(buf) + 1;
    if (path > buf + size)
        path = buf + size;
    struct route_match m;
    enum route_result r = route_find(routes, sizeof(routes) / sizeof(routes[0]), method, path, &m);
    if (r == ROUTE_OK) {
        for (int i = 0; i < m.nparams; i++)
            if (strlen(m.params[i]) >= ROUTE_MAX_PARAM_LEN || strchr(m.params[i], '/'))
                abort();
    }
    free(buf);
    return 0;
}
