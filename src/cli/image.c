/*
 * The host-side subcommands that work on the state directory directly instead of through the
 * daemon: `image build`, `image list` and `doctor`. Building runs mmdebstrap and writes under
 * the state directory, so it needs root and no daemon at all (it is how a host is set up
 * before the first daemon starts).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/sandbox.h"
#include "common/util.h"
#include "driver/doctor.h"
#include "image/image.h"
#include "net/gateway.h"

/* How a build's progress is shown: on a terminal one line redrawn in place (a bar, the stage,
 * the time left), mmdebstrap's own output going to a log file; elsewhere a plain line at each
 * stage, beside mmdebstrap's output. */
struct shown {
    const char *name;
    int tty;
    int last_permille; /* plain lines: the stage last printed */
    int drawn;         /* terminal: a progress line is on the screen */
};

static void show_progress(void *arg, int permille, const char *stage, int64_t left_ms)
{
    struct shown *s = arg;
    char left[48] = "";
    if (left_ms >= 0 && permille < 1000)
        snprintf(left, sizeof(left), ", about %lld s left", (long long)((left_ms + 999) / 1000));
    if (!s->tty) {
        if (permille == s->last_permille)
            return;
        s->last_permille = permille;
        fprintf(stderr, "withruntime: image %s: %d%% %s%s\n", s->name, permille / 10, stage, left);
        return;
    }
    char bar[25];
    int full = permille * 24 / 1000;
    for (int i = 0; i < 24; i++)
        bar[i] = i < full ? '#' : '.';
    bar[24] = '\0';
    fprintf(stderr, "\r\033[Kimage %s [%s] %3d%% %s%s", s->name, bar, permille / 10, stage, left);
    fflush(stderr);
    s->drawn = 1;
}

int cli_image_build(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"force", no_argument, 0, 'f'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    bool force = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "fh", opts, NULL)) != -1) {
        switch (opt) {
        case 'f': force = true; break;
        case 'h': return cli_print_help();
        default: return cli_usage_error("image build", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (argc - optind > 1)
        return cli_usage_error("image build", "expected at most one image NAME");
    const char *name = optind < argc ? argv[optind] : "default";
    if (!image_name_valid(name))
        return cli_usage_error("image build", "bad image name '%s'", name);
    if (geteuid() != 0) {
        cli_errorf("image build needs root: it runs mmdebstrap and writes to %s", c->state_dir);
        return CLI_EXIT_ERR;
    }
    struct wr_err err = {0};
    struct shown shown = {.name = name, .tty = isatty(2), .last_permille = -1};
    struct image_progress pr = {.fn = show_progress, .arg = &shown};
    int log_fd = 2;
    char log_path[PATH_MAX];
    char rootfs[PATH_MAX];
    struct wr_err ignored = {0};
    int built = image_rootfs(c->state_dir, name, rootfs, sizeof(rootfs), &ignored) == 0;
    if (shown.tty && (force || !built)) { /* mmdebstrap's lines would scroll the bar away */
        char images[PATH_MAX];
        snprintf(images, sizeof(images), "%s/images", c->state_dir);
        (void)mkdir(c->state_dir, 0755);
        (void)mkdir(images, 0755);
        snprintf(log_path, sizeof(log_path), "%s/%s.build.log", images, name);
        log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (log_fd < 0)
            log_fd = 2;
    }
    int rc = image_build_progress(c->state_dir, name, force, log_fd, &pr, &err);
    if (shown.drawn)
        fputc('\n', stderr);
    if (log_fd != 2) {
        close(log_fd);
        if (rc < 0)
            fprintf(stderr, "withruntime: the build's log: %s\n", log_path);
    }
    if (rc < 0)
        return cli_fail(&err);
    fprintf(stderr, "withruntime: image %s is built in %s/images/%s\n", name, c->state_dir, name);
    return CLI_EXIT_OK;
}

static int add_image(void *arg, const struct image_info *info)
{
    char created[32];
    format_rfc3339(info->created_at, created, sizeof(created));
    json_array_append_new(arg, json_pack("{s:s, s:I, s:s}", "name", info->name, "size_bytes",
                                         (json_int_t)info->size_bytes, "created_at", created));
    return 0;
}

int cli_image_list(struct cli_ctx *c, int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, 0, 'j'},
        {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0},
    };
    bool as_json = false;
    int opt;
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (opt) {
        case 'j': as_json = true; break;
        case 'h': return cli_print_help();
        default: return cli_usage_error("image list", "unknown option '%s'", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return cli_usage_error("image list", "unexpected argument '%s'", argv[optind]);
    json_t *arr = json_array();
    struct wr_err err = {0};
    if (image_list(c->state_dir, add_image, arr, &err) < 0) {
        json_decref(arr);
        cli_fail(&err);
        if (err.code == EACCES && geteuid() != 0)
            cli_errorf("(run it as root)");
        return CLI_EXIT_ERR;
    }
    if (as_json) {
        json_t *o = json_pack("{s:o}", "images", arr);
        char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s)
            puts(s);
        free(s);
        json_decref(o);
        return CLI_EXIT_OK;
    }
    printf("%-20s  %10s  %s\n", "NAME", "SIZE", "CREATED");
    size_t i;
    json_t *img;
    json_array_foreach(arr, i, img)
    {
        double mb = (double)json_integer_value(json_object_get(img, "size_bytes")) / 1e6;
        printf("%-20s  %8.0fMB  %s\n", cli_shown(img, "name", "?"), mb,
               cli_shown(img, "created_at", "-"));
    }
    json_decref(arr);
    return CLI_EXIT_OK;
}

int cli_cmd_doctor(struct cli_ctx *c, int argc, char **argv)
{
    if (cli_wants_help(argc, argv))
        return cli_print_help();
    if (argc > 1)
        return cli_usage_error("doctor", "unexpected argument '%s'", argv[1]);
    int r = doctor_run(stdout, c->state_dir);
    char detail[256];
    struct wr_err err = {0};
    printf("\nsandbox networking (egress policy, enforced on the host)\n");
    if (gateway_probe(detail, sizeof(detail), &err) == 0)
        printf("  [ok]   %s\n  => networking: usable here\n", detail);
    else
        printf("  [FAIL] %s\n  => networking: NOT usable here: sandboxes get no network, and a "
               "policy with \"internet\": true is refused (install nftables; run as root)\n",
               err.msg);
    fflush(stdout);
    return r == 0 ? CLI_EXIT_OK : CLI_EXIT_ERR;
}
