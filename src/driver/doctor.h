/*
 * `withruntime doctor`: which isolation drivers this host can run, and for the
 * others, why not. Checks by doing (starting a throwaway gVisor sandbox,
 * running a tiny KVM guest), not by looking at version strings alone.
 */
#ifndef WR_DRIVER_DOCTOR_H
#define WR_DRIVER_DOCTOR_H

#include <stdio.h>

/**
 * Runs every check and prints a report for a person to `out`. Takes a few seconds at most
 * (the KVM guest test is cut off after 2 s). Configures the gvisor driver itself with state_dir.
 * Returns 0 if at least the gvisor driver works here, 1 if no driver does.
 */
int doctor_run(FILE *out, const char *state_dir);

/** Result of the KVM long-mode guest test. */
enum doctor_kvm_result {
    DOCTOR_KVM_RUNS,  /* the guest reached 64-bit mode, wrote to an I/O port and halted */
    DOCTOR_KVM_HANGS, /* no exit within the time limit */
    DOCTOR_KVM_FAILS, /* an ioctl failed or the guest exited unexpectedly */
};

/**
 * Runs a one-vCPU long-mode guest in a forked child killed after timeout_ms. Fills detail
 * with what happened. Returns the result.
 */
enum doctor_kvm_result doctor_kvm_guest(int timeout_ms, char *detail, size_t detail_len);

#endif
