/* How fast data moves between two cores right now: a probe for benchmarks
 * and the tuner.
 *
 * On some hosts (virtual machines above all) the cost of moving a cache
 * line from one core to another changes while a program runs: the host
 * places the guest's virtual CPUs on cores that share a cache, then on
 * cores that do not.  Every collective between ranks on one host hands its
 * data over through the caches, so it slows down with it (measured on a
 * 2-core virtual machine: a 1 MiB all_reduce at 98 us for minutes, then at
 * 500 us for minutes, with no context switch and no page fault in either,
 * while memcpy within one core kept its speed).  A figure measured in one
 * phase says nothing about the other, so benchmarks print this probe
 * beside their tables and the tuner records it with its rules.
 *
 * Two threads of this process take turns on one atomic counter (the
 * one-way handoff time of a cache line), then hand 1 MiB back and forth
 * through a shared buffer (at its turn, each copies out what the other
 * wrote and writes its own: the speed of data that has to cross between
 * the cores, one crossing and one local copy per turn). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "probe.h"

#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROBE_BYTES ((size_t)1 << 20)
#define PINGS 2000
#define HANDS 20

typedef struct {
    alignas(64) _Atomic unsigned long turn;
    alignas(64) _Atomic int stop;
    char *shared;
    char *priv[2];
    double deadline;
    /* results (thread 0) */
    double ping_s, hand_s;
    unsigned long pings, hands;
} probe;

static double
mono(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Wait until it is this side's turn (turn == 2c + me).  0: stop. */
static int
wait_turn(probe *p, unsigned long want)
{
    for (unsigned spins = 0;; spins++) {
        if (atomic_load_explicit(&p->turn, memory_order_acquire) == want) {
            return 1;
        }
        if ((spins & 1023) == 1023) {
            if (atomic_load_explicit(&p->stop, memory_order_relaxed)) {
                return 0;
            }
            if (mono() > p->deadline) {
                atomic_store(&p->stop, 1);
                return 0;
            }
            sched_yield(); /* one core: the other side must run */
        }
    }
}

static void
side(probe *p, int me)
{
    unsigned long c = 0;
    while (!atomic_load_explicit(&p->stop, memory_order_relaxed)) {
        double t0 = mono();
        int i;
        for (i = 0; i < PINGS; i++, c++) {
            if (!wait_turn(p, 2 * c + (unsigned long)me)) {
                return;
            }
            atomic_store_explicit(&p->turn, 2 * c + (unsigned long)me + 1,
                                  memory_order_release);
        }
        double t1 = mono();
        for (i = 0; i < HANDS; i++, c++) {
            if (!wait_turn(p, 2 * c + (unsigned long)me)) {
                return;
            }
            /* take what the other side wrote, leave data of its own */
            memcpy(p->priv[me], p->shared, PROBE_BYTES);
            memcpy(p->shared, p->priv[me], PROBE_BYTES);
            atomic_store_explicit(&p->turn, 2 * c + (unsigned long)me + 1,
                                  memory_order_release);
        }
        double t2 = mono();
        if (me == 0) {
            /* each round: one handoff each way */
            p->ping_s += t1 - t0;
            p->pings += 2 * PINGS;
            p->hand_s += t2 - t1;
            p->hands += 2 * HANDS;
            if (t2 > p->deadline) {
                atomic_store(&p->stop, 1);
            }
        }
    }
}

static void *
other(void *arg)
{
    side(arg, 1);
    return NULL;
}

int
pd_probe_handoff(double seconds, double *ns, double *gbps)
{
    *ns = 0.0;
    *gbps = 0.0;
    probe *p = calloc(1, sizeof(*p));
    char *mem = malloc(3 * PROBE_BYTES);
    if (p == NULL || mem == NULL) {
        free(p);
        free(mem);
        return -1;
    }
    p->shared = mem;
    p->priv[0] = mem + PROBE_BYTES;
    p->priv[1] = mem + 2 * PROBE_BYTES;
    memset(mem, 1, 3 * PROBE_BYTES);
    p->deadline = mono() + (seconds > 0 ? seconds : 0.1);
    pthread_t t;
    if (pthread_create(&t, NULL, other, p) != 0) {
        free(p);
        free(mem);
        return -1;
    }
    /* thread 0 ends the probe at the deadline; the other sees stop */
    side(p, 0);
    atomic_store(&p->stop, 1);
    pthread_join(t, NULL);
    if (p->pings > 0) {
        *ns = p->ping_s / (double)p->pings * 1e9;
    }
    if (p->hands > 0 && p->hand_s > 0) {
        *gbps = (double)PROBE_BYTES * (double)p->hands / p->hand_s / 1e9;
    }
    int ok = p->pings > 0 && p->hands > 0;
    free(p);
    free(mem);
    return ok ? 0 : -1;
}
