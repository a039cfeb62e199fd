/* Cross-memory attach (see cma.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "cma.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

/* PYDDP_CMA and PYDDP_CMA_THRESHOLD, read once per process: a process
 * forked after the first read (a test harness's ranks, a launcher's
 * workers) reads them again from its own environment (pd_cma_env_forget,
 * run in the child of every fork). */
static int wanted_cached = -1;
static size_t threshold_cached = 0;
static int threshold_read = 0;

void
pd_cma_env_forget(void)
{
    wanted_cached = -1;
    threshold_cached = 0;
    threshold_read = 0;
}

int
pd_cma_wanted(void)
{
    if (wanted_cached < 0) {
        const char *e = getenv("PYDDP_CMA");
        wanted_cached = !(e != NULL && strcmp(e, "0") == 0);
    }
    return wanted_cached;
}

size_t
pd_cma_threshold(void)
{
    if (!threshold_read) {
        /* unset, or past every size: PD_CMA_DEFAULT (each collective's
         * own threshold) */
        threshold_cached = pd_shm_env_bytes("PYDDP_CMA_THRESHOLD",
                                            PD_CMA_DEFAULT, 0,
                                            PD_CMA_DEFAULT - 1);
        threshold_read = 1;
    }
    return threshold_cached;
}

/* One transfer, looping over partial ones and EINTR. */
static pd_status
cma_move(pd_shm *s, int p, int write, void *local, uint64_t remote,
         size_t len, const char *what)
{
    pid_t pid = (pid_t)pd_shm_ctrl_of(s, p)->pid;
    size_t done = 0;
    while (done < len) {
        struct iovec l = {(char *)local + done, len - done};
        struct iovec r = {(void *)(uintptr_t)(remote + done), len - done};
        ssize_t n = write ? process_vm_writev(pid, &l, 1, &r, 1, 0)
                          : process_vm_readv(pid, &l, 1, &r, 1, 0);
        if (n > 0) {
            done += (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR) {
            continue;
        }
        int e = n < 0 ? errno : EFAULT;
        if (e == ESRCH || kill(pid, 0) != 0) {
            return pd_error(PD_ENETWORK,
                            "%s: rank %d died or left during a single-copy "
                            "transfer (%s: %s)", what, p,
                            write ? "process_vm_writev" : "process_vm_readv",
                            strerror(e));
        }
        return pd_error(PD_ESYS,
                        "%s: single-copy transfer %s rank %d failed (%s of "
                        "%zu bytes at offset %zu: %s)", what,
                        write ? "to" : "from", p,
                        write ? "process_vm_writev" : "process_vm_readv",
                        len, done, strerror(e));
    }
    return PD_OK;
}

pd_status
pd_cma_read(pd_shm *s, int p, void *dst, uint64_t src, size_t len,
            const char *what)
{
    return cma_move(s, p, 0, dst, src, len, what);
}

pd_status
pd_cma_write(pd_shm *s, int p, uint64_t dst, const void *src, size_t len,
             const char *what)
{
    return cma_move(s, p, 1, (void *)src, dst, len, what);
}

pd_status
pd_cma_probe(pd_shm *s)
{
    if (!pd_cma_wanted()) {
        return pd_error(PD_EINVAL, "PYDDP_CMA=0");
    }
    for (int p = 0; p < pd_shm_size(s); p++) {
        if (p == pd_shm_rank(s)) {
            continue;
        }
        pd_shm_ctrl *c = pd_shm_ctrl_of(s, p);
        uint64_t got = 0;
        struct iovec l = {&got, sizeof(got)};
        struct iovec r = {(void *)(uintptr_t)c->cma_addr, sizeof(got)};
        ssize_t n;
        do {
            n = process_vm_readv((pid_t)c->pid, &l, 1, &r, 1, 0);
        } while (n < 0 && errno == EINTR);
        /* fault injection for the tests: the kernel refusing, as under
         * Yama's ptrace_scope 2 */
        const char *inject = getenv("PYDDP_TEST_CMA_FAIL");
        if (inject != NULL && strcmp(inject, "EPERM") == 0) {
            n = -1;
            errno = EPERM;
        }
        if (n < 0) {
            int e = errno;
            return pd_error(PD_ESYS,
                            "process_vm_readv of local rank %d: %s%s", p,
                            strerror(e),
                            e == EPERM ? " (ptrace is restricted: Yama's "
                                         "kernel.yama.ptrace_scope, or a "
                                         "container without CAP_SYS_PTRACE)"
                                       : "");
        }
        if (n != (ssize_t)sizeof(got) || got != c->cma_cookie) {
            return pd_error(PD_ESYS,
                            "process_vm_readv of local rank %d read another "
                            "process (separate pid namespaces?)", p);
        }
    }
    return PD_OK;
}
