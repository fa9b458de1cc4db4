/*
 * `withruntime doctor`: proves, by running things, which drivers this host
 * can use. gVisor: runsc's version, cgroups, an overlay mount where sandboxes
 * will live, a throwaway sandbox on the platform, the default image. microvm:
 * /dev/kvm and, because a KVM that opens is not a KVM that runs guests (a
 * nested paravirtual hypervisor such as kvm-pvm hangs on an ordinary one), a
 * tiny 64-bit guest in a child process that is killed if it does not finish.
 */
#include "driver/doctor.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/kvm.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/proc.h"
#include "common/util.h"
#include "driver/cgroup.h"
#include "driver/gvisor.h"
#include "image/image.h"

#define KVM_TIMEOUT_MS 2000

static void line(FILE *out, const char *tag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void line(FILE *out, const char *tag, const char *fmt, ...)
{
    fprintf(out, "  %-6s ", tag);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(out, fmt, ap);
    va_end(ap);
    fputc('\n', out);
}

/* Finds an executable in PATH; fills path. Returns 1 if found. */
static int find_in_path(const char *name, char *path, size_t pathlen)
{
    const char *env = getenv("PATH");
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", env && env[0] ? env : "/usr/local/bin:/usr/bin:/bin");
    char *save = NULL;
    for (char *dir = strtok_r(buf, ":", &save); dir; dir = strtok_r(NULL, ":", &save)) {
        snprintf(path, pathlen, "%s/%s", dir, name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0)
            return 1;
    }
    return 0;
}

/* ---- overlayfs ---- */

/* Mounts a small overlay in a scratch directory under dir and checks a write lands in the
 * upper layer. Returns 0 or -1 with err set. */
static int overlay_test(const char *dir, struct wr_err *err)
{
    char base[PATH_MAX];
    snprintf(base, sizeof(base), "%s/.doctor-XXXXXX", dir);
    if (!mkdtemp(base))
        return wr_err_sys(err, errno, "creating a scratch directory in %s", dir);
    char lower[PATH_MAX + 16], upper[PATH_MAX + 16], work[PATH_MAX + 16], merged[PATH_MAX + 16];
    snprintf(lower, sizeof(lower), "%s/lower", base);
    snprintf(upper, sizeof(upper), "%s/upper", base);
    snprintf(work, sizeof(work), "%s/work", base);
    snprintf(merged, sizeof(merged), "%s/merged", base);
    int ret = -1;
    bool mounted = false;
    if (mkdir(lower, 0755) < 0 || mkdir(upper, 0755) < 0 || mkdir(work, 0700) < 0 ||
        mkdir(merged, 0755) < 0) {
        wr_err_sys(err, errno, "creating directories in %s", base);
        goto out;
    }
    char opts[4 * PATH_MAX];
    snprintf(opts, sizeof(opts), "lowerdir=%s,upperdir=%s,workdir=%s,index=off", lower, upper,
             work);
    if (mount("overlay", merged, "overlay", MS_NODEV, opts) < 0) {
        wr_err_sys(err, errno, "mounting an overlay in %s", base);
        goto out;
    }
    mounted = true;
    char f[PATH_MAX + 32], g[PATH_MAX + 32];
    snprintf(f, sizeof(f), "%s/probe", merged);
    snprintf(g, sizeof(g), "%s/probe", upper);
    int fd = open(f, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
        wr_err_sys(err, errno, "writing through the overlay");
        goto out;
    }
    close(fd);
    if (access(g, F_OK) < 0) {
        wr_err_set(err, EIO, "a file written through the overlay did not land in its upper layer");
        goto out;
    }
    ret = 0;
out:
    if (mounted)
        umount2(merged, MNT_DETACH);
    unlink(g);
    rmdir(merged);
    char ww[PATH_MAX + 32];
    snprintf(ww, sizeof(ww), "%s/work", work);
    rmdir(ww);
    rmdir(work);
    rmdir(upper);
    rmdir(lower);
    rmdir(base);
    return ret;
}

/* ---- KVM ---- */

/* What the KVM child reports through its pipe. */
struct kvm_report {
    int stage; /* 0 = success, else the step that failed */
    int err;   /* errno of the failed step, or 0 */
    int exit_reason;
};

enum {
    KS_OK,
    KS_OPEN,
    KS_API,
    KS_VM,
    KS_MEM,
    KS_VCPU,
    KS_RUNMAP,
    KS_CPUID,
    KS_SREGS,
    KS_REGS,
    KS_RUN_IO,
    KS_RUN_HLT,
};

static const char *const kvm_stage_names[] = {
    "ok",
    "opening /dev/kvm",
    "KVM_GET_API_VERSION",
    "KVM_CREATE_VM",
    "setting up guest memory",
    "KVM_CREATE_VCPU",
    "mapping the vCPU run area",
    "KVM_SET_CPUID2",
    "KVM_SET_SREGS (64-bit mode)",
    "KVM_SET_REGS",
    "running to the guest's port write",
    "running to the guest's hlt",
};

#define GUEST_MEM 0x200000
#define GUEST_GDT 0x1000
#define GUEST_PML4 0x2000
#define GUEST_PDPT 0x3000
#define GUEST_PD 0x4000
#define GUEST_CODE 0x8000
#define GUEST_PORT 0x10
#define GUEST_BYTE 0x42

/* Runs in the forked child: only system calls, no allocation or stdio. */
static struct kvm_report kvm_child(void)
{
    struct kvm_report r = {0, 0, -1};
#define FAIL(st)                                                                                   \
    do {                                                                                           \
        r.stage = (st);                                                                            \
        r.err = errno;                                                                             \
        return r;                                                                                  \
    } while (0)
    int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kvm < 0)
        FAIL(KS_OPEN);
    if (ioctl(kvm, KVM_GET_API_VERSION, 0) != KVM_API_VERSION)
        FAIL(KS_API);
    int vm = ioctl(kvm, KVM_CREATE_VM, 0);
    if (vm < 0)
        FAIL(KS_VM);
    uint8_t *mem = mmap(NULL, GUEST_MEM, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED)
        FAIL(KS_MEM);
    struct kvm_userspace_memory_region region = {.slot = 0,
                                                 .guest_phys_addr = 0,
                                                 .memory_size = GUEST_MEM,
                                                 .userspace_addr = (uint64_t)(uintptr_t)mem};
    if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &region) < 0)
        FAIL(KS_MEM);

    /* GDT: null, 64-bit code, data. */
    uint64_t *gdt = (uint64_t *)(mem + GUEST_GDT);
    gdt[1] = 0x00af9b000000ffffULL;
    gdt[2] = 0x00cf93000000ffffULL;
    /* Identity-map the first 2 MiB with one large page. */
    uint64_t *pml4 = (uint64_t *)(mem + GUEST_PML4);
    uint64_t *pdpt = (uint64_t *)(mem + GUEST_PDPT);
    uint64_t *pd = (uint64_t *)(mem + GUEST_PD);
    pml4[0] = GUEST_PDPT | 0x3; /* present, writable */
    pdpt[0] = GUEST_PD | 0x3;
    pd[0] = 0x83; /* present, writable, 2 MiB page at 0 */
    /* movabs rax, 0x42 << 56; shr rax, 56; out 0x10, al; hlt. Only 64-bit mode decodes this
     * to al = 0x42 (in 32-bit mode 0x48 is `dec eax`). */
    static const uint8_t code[] = {0x48,       0xb8, 0,    0,    0,  0,    0,          0,   0,
                                   GUEST_BYTE, 0x48, 0xc1, 0xe8, 56, 0xe6, GUEST_PORT, 0xf4};
    memcpy(mem + GUEST_CODE, code, sizeof(code));

    int vcpu = ioctl(vm, KVM_CREATE_VCPU, 0);
    if (vcpu < 0)
        FAIL(KS_VCPU);
    int runsz = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0);
    if (runsz <= 0)
        FAIL(KS_RUNMAP);
    struct kvm_run *run = mmap(NULL, (size_t)runsz, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu, 0);
    if (run == MAP_FAILED)
        FAIL(KS_RUNMAP);

    /* Give the guest the CPUID KVM supports (long mode among it), as any VMM does. */
    static union {
        struct kvm_cpuid2 c;
        uint8_t raw[sizeof(struct kvm_cpuid2) + 256 * sizeof(struct kvm_cpuid_entry2)];
    } cpuid;
    cpuid.c.nent = 256;
    if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, &cpuid.c) < 0 ||
        ioctl(vcpu, KVM_SET_CPUID2, &cpuid.c) < 0)
        FAIL(KS_CPUID);

    struct kvm_sregs sregs;
    if (ioctl(vcpu, KVM_GET_SREGS, &sregs) < 0)
        FAIL(KS_SREGS);
    struct kvm_segment cs = {.base = 0,
                             .limit = 0xffffffff,
                             .selector = 1 << 3,
                             .type = 11,
                             .present = 1,
                             .dpl = 0,
                             .db = 0,
                             .s = 1,
                             .l = 1,
                             .g = 1};
    struct kvm_segment ds = cs;
    ds.type = 3;
    ds.selector = 2 << 3;
    ds.l = 0;
    ds.db = 1;
    sregs.cs = cs;
    sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = ds;
    sregs.gdt.base = GUEST_GDT;
    sregs.gdt.limit = 3 * 8 - 1;
    sregs.cr3 = GUEST_PML4;
    sregs.cr4 = 1u << 5;                 /* PAE */
    sregs.cr0 = 0x80050033;              /* PG, AM, WP, NE, ET, MP, PE */
    sregs.efer = (1u << 8) | (1u << 10); /* LME, LMA */
    if (ioctl(vcpu, KVM_SET_SREGS, &sregs) < 0)
        FAIL(KS_SREGS);
    struct kvm_regs regs;
    memset(&regs, 0, sizeof(regs));
    regs.rflags = 2;
    regs.rip = GUEST_CODE;
    regs.rsp = GUEST_MEM - 16;
    if (ioctl(vcpu, KVM_SET_REGS, &regs) < 0)
        FAIL(KS_REGS);

    if (ioctl(vcpu, KVM_RUN, 0) < 0)
        FAIL(KS_RUN_IO);
    r.exit_reason = (int)run->exit_reason;
    if (run->exit_reason != KVM_EXIT_IO || run->io.direction != KVM_EXIT_IO_OUT ||
        run->io.port != GUEST_PORT || ((uint8_t *)run)[run->io.data_offset] != GUEST_BYTE) {
        errno = 0;
        FAIL(KS_RUN_IO);
    }
    if (ioctl(vcpu, KVM_RUN, 0) < 0)
        FAIL(KS_RUN_HLT);
    r.exit_reason = (int)run->exit_reason;
    if (run->exit_reason != KVM_EXIT_HLT) {
        errno = 0;
        FAIL(KS_RUN_HLT);
    }
    return r;
#undef FAIL
}

enum doctor_kvm_result doctor_kvm_guest(int timeout_ms, char *detail, size_t detail_len)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(detail, detail_len, "pipe: %s", strerror(errno));
        return DOCTOR_KVM_FAILS;
    }
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(detail, detail_len, "fork: %s", strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return DOCTOR_KVM_FAILS;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        struct kvm_report r = kvm_child();
        (void)!write(pfd[1], &r, sizeof(r));
        _exit(0);
    }
    close(pfd[1]);
    /* The pidfd keeps a possibly recycled pid from being killed by mistake. */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    struct pollfd p = {.fd = pfd[0], .events = POLLIN};
    int pr;
    do
        pr = poll(&p, 1, timeout_ms);
    while (pr < 0 && errno == EINTR);
    struct kvm_report r;
    ssize_t n = pr > 0 ? read(pfd[0], &r, sizeof(r)) : -1;
    close(pfd[0]);
    enum doctor_kvm_result res;
    if (pr == 0) {
        res = DOCTOR_KVM_HANGS;
        snprintf(detail, detail_len,
                 "hangs on a long-mode guest (timed out after %d s) — e.g. a nested "
                 "paravirtual hypervisor",
                 timeout_ms / 1000);
        if (pidfd >= 0)
            syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
        else
            kill(pid, SIGKILL);
    } else if (n != (ssize_t)sizeof(r)) {
        res = DOCTOR_KVM_FAILS;
        snprintf(detail, detail_len, "the test process died without an answer");
    } else if (r.stage == KS_OK) {
        res = DOCTOR_KVM_RUNS;
        snprintf(detail, detail_len, "runs a long-mode guest (port write and hlt seen)");
    } else {
        res = DOCTOR_KVM_FAILS;
        const char *what = r.stage > 0 && r.stage < (int)WR_ARRAY_LEN(kvm_stage_names)
                               ? kvm_stage_names[r.stage]
                               : "?";
        if (r.err)
            snprintf(detail, detail_len, "cannot run a long-mode guest: %s failed: %s", what,
                     strerror(r.err));
        else
            snprintf(detail, detail_len,
                     "cannot run a long-mode guest: %s: unexpected exit reason %d", what,
                     r.exit_reason);
    }
    /* Reap it (a reaper thread, if running, may get there first); don't wait long for a
     * process stuck in the kernel. */
    for (int i = 0; i < 100; i++) {
        pid_t w = waitpid(pid, NULL, WNOHANG);
        if (w == pid || (w < 0 && errno == ECHILD))
            break;
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (pidfd >= 0)
        close(pidfd);
    return res;
}

/* ---- the report ---- */

static bool check_gvisor(FILE *out, const char *state_dir)
{
    bool ok = true;
    char path[PATH_MAX], ver[64];
    struct wr_err err = {0};
    fprintf(out, "gvisor driver (gVisor's runsc, the default)\n");

    if (!find_in_path("runsc", path, sizeof(path))) {
        line(out, "[FAIL]",
             "runsc is not installed: install it from bookworm-backports "
             "(scripts/setup.sh does)");
        ok = false;
    } else if (gvisor_runsc_version(ver, sizeof(ver), &err) < 0) {
        line(out, "[FAIL]", "runsc at %s does not run: %s", path, err.msg);
        ok = false;
    } else if (gvisor_runsc_too_old(ver)) {
        line(out, "[FAIL]",
             "runsc %s at %s is too old: ls and stat fail inside its sandboxes; "
             "install runsc from bookworm-backports",
             ver, path);
        ok = false;
    } else {
        line(out, "[ok]", "runsc %s at %s", ver, path);
    }

    char detail[256];
    if (cgroup_check(detail, sizeof(detail), &err) < 0) {
        line(out, "[FAIL]", "cgroups: %s", err.msg);
        ok = false;
    } else {
        line(out, "[ok]", "cgroups: %s", detail);
    }

    /* Overlays are made where the sandboxes live; test there (or the nearest parent). */
    char dir[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", state_dir);
    struct stat st;
    while (stat(dir, &st) < 0 && strrchr(dir, '/') && strcmp(dir, "/")) {
        char *slash = strrchr(dir, '/');
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
    }
    if (overlay_test(dir, &err) < 0) {
        line(out, "[FAIL]", "overlayfs: %s", err.msg);
        ok = false;
    } else {
        line(out, "[ok]", "overlayfs: a test overlay in %s works", dir);
    }

    const char *platform = NULL;
    if (ok) {
        static const char *const platforms[] = {"systrap", "ptrace"};
        for (size_t i = 0; i < WR_ARRAY_LEN(platforms) && !platform; i++) {
            uint64_t t0 = now_ms_monotonic();
            if (gvisor_platform_check(platforms[i], &err) == 0) {
                platform = platforms[i];
                line(out, "[ok]",
                     "platform %s: started and stopped a throwaway sandbox in "
                     "%llu ms",
                     platforms[i], (unsigned long long)(now_ms_monotonic() - t0));
            } else {
                line(out, "[FAIL]", "platform %s: %s", platforms[i], err.msg);
            }
        }
        if (!platform)
            ok = false;
    }

    char rootfs[PATH_MAX];
    if (image_rootfs(state_dir, "default", rootfs, sizeof(rootfs), &err) < 0)
        line(out, "[warn]", "image \"default\": %s (takes a minute or so)", err.msg);
    else
        line(out, "[ok]", "image \"default\" is built: %s", rootfs);

    if (ok)
        fprintf(out, "  => gvisor: usable here (platform %s)\n\n", platform);
    else
        fprintf(out, "  => gvisor: NOT usable here (see [FAIL] above)\n\n");
    return ok;
}

static void check_microvm(FILE *out)
{
    fprintf(out, "microvm driver (a KVM microVM; not part of this build yet)\n");
    bool ok = true;
    int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        line(out, "[FAIL]", "/dev/kvm: %s", strerror(errno));
        ok = false;
    } else {
        int v = ioctl(fd, KVM_GET_API_VERSION, 0);
        close(fd);
        if (v != KVM_API_VERSION) {
            line(out, "[FAIL]", "/dev/kvm: KVM API version %d (want %d)", v, KVM_API_VERSION);
            ok = false;
        } else {
            line(out, "[ok]", "/dev/kvm opens; KVM API version %d", v);
            char detail[256];
            enum doctor_kvm_result r = doctor_kvm_guest(KVM_TIMEOUT_MS, detail, sizeof(detail));
            line(out, r == DOCTOR_KVM_RUNS ? "[ok]" : "[FAIL]", "KVM %s", detail);
            ok = r == DOCTOR_KVM_RUNS;
        }
    }
    char path[PATH_MAX];
    bool qemu = find_in_path("qemu-system-x86_64", path, sizeof(path));
    if (qemu)
        line(out, "[ok]", "qemu-system-x86_64 at %s", path);
    else
        line(out, "[FAIL]", "qemu-system-x86_64 is not installed (Debian package qemu-system-x86)");
    if (find_in_path("firecracker", path, sizeof(path)))
        line(out, "[ok]", "firecracker at %s", path);
    if (ok && qemu)
        fprintf(out, "  => microvm: this host could run it\n\n");
    else if (ok)
        fprintf(out, "  => microvm: KVM works, but no VMM is installed\n\n");
    else
        fprintf(out, "  => microvm: NOT usable here: KVM does not run an ordinary guest%s\n\n",
                qemu ? " (QEMU's emulation could still run it, slowly, for tests)" : "");
}

int doctor_run(FILE *out, const char *state_dir)
{
    fprintf(out, "withruntime doctor (state directory %s)\n\n", state_dir);
    if (geteuid() != 0)
        fprintf(out, "note: not running as root; the gvisor checks need root and will fail\n\n");
    struct driver_config cfg = {.state_dir = state_dir, .platform = NULL, .debug = 0};
    struct wr_err err = {0};
    bool gvisor = false;
    if (driver_gvisor.configure(&cfg, &err) < 0)
        fprintf(out, "gvisor driver\n  [FAIL] %s\n  => gvisor: NOT usable here\n\n", err.msg);
    else
        gvisor = check_gvisor(out, state_dir);
    check_microvm(out);
    fprintf(out, "drivers usable here: %s\n", gvisor ? "gvisor" : "none");
    fflush(out);
    return gvisor ? 0 : 1;
}
