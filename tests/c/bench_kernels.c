/* Throughput of the reduction and cast kernels against memcpy.
 *
 * Bytes counted are the bytes the operation must move: memcpy reads n and
 * writes n; dst += src reads 2n and writes n; a cast reads and writes its
 * two element sizes.  A kernel "runs at memory bandwidth" when its GB/s on
 * arrays far larger than the caches is close to memcpy's.  The in-cache
 * rows show whether a loop is vectorised: a scalar float32 add (built with
 * the vectoriser off) is printed beside the kernel for comparison.
 *
 * usage: bench_kernels [MiB per array, default 128]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"

#define SMALL_ARRAY (8 * 1024) /* bytes per array: both fit in L1d */

/* The same loop as the kernel, kept scalar so the two can be compared. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("no-tree-vectorize")))
#endif
static void
scalar_f32_sum(float *restrict d, const float *restrict s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        d[i] = d[i] + s[i];
    }
}

enum what {
    MEMCPY,
    SCALAR_F32_SUM,
    REDUCE,
    TO_F32,
    FROM_F32,
};

struct job {
    const char *name;
    enum what what;
    pd_dtype dt;
    pd_redop op;
};

static void
run_once(const struct job *j, void *a, void *b, size_t n)
{
    switch (j->what) {
    case MEMCPY:
        memcpy(a, b, n * 4);
        break;
    case SCALAR_F32_SUM:
        scalar_f32_sum(a, b, n);
        break;
    case REDUCE:
        pd_reduce(j->dt, j->op, a, b, n);
        break;
    case TO_F32:
        pd_cast_to_f32(j->dt, a, b, n);
        break;
    case FROM_F32:
        pd_cast_from_f32(j->dt, a, b, n);
        break;
    }
}

/* Elements per array for a byte budget, and bytes moved per element. */
static size_t
elem_size(const struct job *j)
{
    switch (j->what) {
    case MEMCPY:
    case SCALAR_F32_SUM:
        return 4;
    case REDUCE:
        return pd_dtype_size(j->dt);
    default:
        return 4; /* the float32 side is the larger */
    }
}

static double
bytes_moved(const struct job *j, size_t n)
{
    switch (j->what) {
    case MEMCPY:
        return 2.0 * 4 * (double)n;
    case SCALAR_F32_SUM:
        return 3.0 * 4 * (double)n;
    case REDUCE:
        return 3.0 * (double)pd_dtype_size(j->dt) * (double)n;
    default:
        return 6.0 * (double)n; /* 4 bytes one side, 2 the other */
    }
}

/* Best GB/s over enough repetitions to run about `seconds`. */
static double
measure(const struct job *j, void *a, void *b, size_t bytes, double seconds)
{
    size_t n = bytes / elem_size(j);
    run_once(j, a, b, n); /* fault pages in, warm caches */
    double best = 0.0;
    double end = pd_now() + seconds;
    int reps = 0;
    while (pd_now() < end || reps < 3) {
        int inner = bytes <= SMALL_ARRAY ? 2000 : 1;
        double t0 = pd_now();
        for (int k = 0; k < inner; k++) {
            run_once(j, a, b, n);
        }
        double dt = pd_now() - t0;
        double gbs = bytes_moved(j, n) * inner / dt / 1e9;
        if (gbs > best) {
            best = gbs;
        }
        reps++;
    }
    return best;
}

int
main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 128;
    size_t big = mib << 20;
    char *a = malloc(big), *b = malloc(big);
    if (a == NULL || b == NULL) {
        fprintf(stderr, "cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
    /* small floats keep sums finite, so no slow special cases get timed */
    for (size_t i = 0; i < big / 4; i++) {
        ((float *)a)[i] = (float)(i % 7) * 0.25f;
        ((float *)b)[i] = (float)(i % 5) * 0.125f;
    }

    static const struct job jobs[] = {
        {"memcpy", MEMCPY, PD_FLOAT32, PD_SUM},
        {"scalar f32 add (no vectoriser)", SCALAR_F32_SUM, PD_FLOAT32,
         PD_SUM},
        {"pd_reduce float32 SUM", REDUCE, PD_FLOAT32, PD_SUM},
        {"pd_reduce float32 MAX", REDUCE, PD_FLOAT32, PD_MAX},
        {"pd_reduce float64 SUM", REDUCE, PD_FLOAT64, PD_SUM},
        {"pd_reduce int32 SUM", REDUCE, PD_INT32, PD_SUM},
        {"pd_reduce int64 SUM", REDUCE, PD_INT64, PD_SUM},
        {"pd_reduce uint8 BXOR", REDUCE, PD_UINT8, PD_BXOR},
        {"pd_reduce complex64 PRODUCT", REDUCE, PD_COMPLEX64, PD_PRODUCT},
        {"pd_cast_to_f32 float16", TO_F32, PD_FLOAT16, PD_SUM},
        {"pd_cast_from_f32 float16", FROM_F32, PD_FLOAT16, PD_SUM},
        {"pd_cast_to_f32 bfloat16", TO_F32, PD_BFLOAT16, PD_SUM},
        {"pd_cast_from_f32 bfloat16", FROM_F32, PD_BFLOAT16, PD_SUM},
    };
    printf("%-34s %14s %14s\n", "GB/s (bytes the op must move)",
           "in L1", "in memory");
    printf("%-34s %10d KiB %10zu MiB  (per array)\n", "",
           SMALL_ARRAY / 1024, mib);
    for (size_t i = 0; i < sizeof(jobs) / sizeof(jobs[0]); i++) {
        double small = measure(&jobs[i], a, b, SMALL_ARRAY, 0.2);
        double large = measure(&jobs[i], a, b, big, 1.0);
        printf("%-34s %14.1f %14.1f\n", jobs[i].name, small, large);
    }
    free(a);
    free(b);
    return 0;
}
