/*
 * Fuzz target: the tar extractor (common/tar.c), which reads archives a sandbox made, on
 * arbitrary bytes: the header and pax parsers directly, then a whole extraction into a scratch
 * directory fed in two pieces split at a byte chosen by the input's first byte. The invariant
 * beside "no crash": nothing ever appears beside the target directory.
 */
#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/tar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char base[64], target[80];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    remove(p);
    return 0;
}

static void cleanup(void)
{
    nftw(base, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct wr_err err = {0};
    struct tar_hdr h;
    for (size_t off = 0; off + TAR_BLOCK <= size; off += TAR_BLOCK)
        tar_parse_header(data + off, &h, &err);
    memset(&h, 0, sizeof(h));
    tar_apply_pax(data, size, &h, &err);

    if (!base[0]) {
        snprintf(base, sizeof(base), "/tmp/wr-fuzz-tar-XXXXXX");
        if (!mkdtemp(base))
            abort();
        snprintf(target, sizeof(target), "%s/in", base);
        atexit(cleanup);
    }
    mkdir(target, 0700);
    struct untar_limits lim = {.max_bytes = 1 << 20, .max_entries = 64};
    struct untar *u = untar_new(open(target, O_RDONLY | O_DIRECTORY | O_CLOEXEC), &lim);
    size_t split = size ? data[0] % (size + 1) : 0;
    if (untar_feed(u, data, split, &err) == 0 &&
        untar_feed(u, data + split, size - split, &err) == 0)
        untar_finish(u, &err);
    untar_free(u);
    /* Whatever the archive said, the scratch directory holds the target and nothing else. */
    DIR *d = opendir(base);
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "in"))
            abort();
    if (d)
        closedir(d);
    /* Emptied for the next input (the base stays). */
    nftw(target, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}
