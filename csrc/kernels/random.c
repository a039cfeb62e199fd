/* torch-compatible mt19937, randperm, randint, multinomial and
 * DistributedSampler indices (see random.h).
 *
 * The shuffles draw their random numbers in exactly torch's order, but a
 * batch ahead of the swaps: the swap targets do not depend on the data, so
 * they are computed and prefetched while the previous batch is swapped,
 * which hides the cache misses of a permutation larger than the caches.
 */
#include "random.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MT_MATRIX_A 0x9908b0dfu
#define MT_UMASK 0x80000000u
#define MT_LMASK 0x7fffffffu

/* Swap targets computed ahead of the swaps (see the file comment). */
#define RP_BATCH 64

void
pd_mt_seed(pd_mt19937 *g, uint64_t seed)
{
    g->seed = seed;
    g->seeded = 1;
    g->state[0] = (uint32_t)(seed & 0xffffffffu);
    for (uint32_t j = 1; j < PD_MT_N; j++) {
        uint32_t prev = g->state[j - 1];
        g->state[j] = 1812433253u * (prev ^ (prev >> 30)) + j;
    }
    g->left = 1;
    g->next = 0;
}

int
pd_mt_valid(const pd_mt19937 *g)
{
    return g->seeded != 0 && g->left > 0 && g->left <= PD_MT_N &&
           g->next <= PD_MT_N;
}

static inline uint32_t
mt_twist(uint32_t u, uint32_t v)
{
    return (((u & MT_UMASK) | (v & MT_LMASK)) >> 1) ^
           ((v & 1u) ? MT_MATRIX_A : 0u);
}

/* Regenerate all 624 words (at::mt19937_engine::next_state). */
static void
mt_next_state(pd_mt19937 *g)
{
    uint32_t *s = g->state;
    int k;
    g->left = PD_MT_N;
    g->next = 0;
    for (k = 0; k < PD_MT_N - PD_MT_M; k++) {
        s[k] = s[k + PD_MT_M] ^ mt_twist(s[k], s[k + 1]);
    }
    for (; k < PD_MT_N - 1; k++) {
        s[k] = s[k + PD_MT_M - PD_MT_N] ^ mt_twist(s[k], s[k + 1]);
    }
    s[PD_MT_N - 1] = s[PD_MT_M - 1] ^ mt_twist(s[PD_MT_N - 1], s[0]);
}

static inline uint32_t
mt_temper(uint32_t y)
{
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

static inline uint32_t
mt_draw(pd_mt19937 *g)
{
    if (--g->left == 0) {
        mt_next_state(g);
    }
    return mt_temper(g->state[g->next++]);
}

/* buf[0..count-1] = the next count outputs of mt_draw, tempering whole runs
 * of state words in a loop the compiler vectorises. */
static void
mt_fill(pd_mt19937 *g, uint32_t *buf, size_t count)
{
    while (count > 0) {
        if (g->left <= 1) {
            /* The draw that regenerates the state reads word 0 and leaves
             * left at N (mt_draw). */
            mt_next_state(g);
            *buf++ = mt_temper(g->state[g->next++]);
            count--;
            continue;
        }
        size_t take = (size_t)(g->left - 1);
        if (take > count) {
            take = count;
        }
        const uint32_t *src = g->state + g->next;
        for (size_t k = 0; k < take; k++) {
            buf[k] = mt_temper(src[k]);
        }
        g->next += (uint32_t)take;
        g->left -= (int32_t)take;
        buf += take;
        count -= take;
    }
}

static inline uint64_t
mt_draw64(pd_mt19937 *g)
{
    uint64_t hi = mt_draw(g);
    uint64_t lo = mt_draw(g);
    return (hi << 32) | lo;
}

uint32_t
pd_mt_random(pd_mt19937 *g)
{
    return mt_draw(g);
}

uint64_t
pd_mt_random64(pd_mt19937 *g)
{
    return mt_draw64(g);
}

/* ------------------------------------------------------------ randperm */

#if defined(__GNUC__) || defined(__clang__)
#define PREFETCH_W(p) __builtin_prefetch((p), 1, 0)
#else
#define PREFETCH_W(p) ((void)(p))
#endif

/* Swap targets of positions i0 .. i0+cnt-1 of a forward shuffle of nn
 * elements: z[k] = i + rb[k] % (nn - i), i = i0 + k, every nn - i >= 2 and
 * nn < 2**31.  The remainder comes from a double division (vectorised:
 * 32-bit integer division is the most expensive step of a shuffle that fits
 * in the caches): for r, d < 2**32 the correctly rounded r / d truncates to
 * floor(r / d) or one more (both are representable and rounding is
 * monotonic), and one more makes r - q*d wrap to 2**32 - (d - m) >= d, so
 * min(m, m + d) in uint32 arithmetic is exactly r % d.  Every q < 2**31. */
#define RP_TARGETS_BODY                                                      \
    for (uint32_t k = 0; k < cnt; k++) {                                     \
        uint32_t i = i0 + k;                                                 \
        uint32_t d = nn - i;                                                 \
        uint32_t r = rb[k];                                                  \
        double rd = (double)(int32_t)(r ^ 0x80000000u) + 2147483648.0;       \
        double dd = (double)(int32_t)d;                                      \
        uint32_t q = (uint32_t)(int32_t)(rd / dd);                           \
        uint32_t m = r - q * d;                                              \
        uint32_t m2 = m + d;                                                 \
        z[k] = i + (m2 < m ? m2 : m);                                        \
    }

static void
rp_targets(const uint32_t *restrict rb, uint32_t *restrict z, uint32_t i0,
           uint32_t nn, uint32_t cnt)
{
    RP_TARGETS_BODY
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(PD_KERNELS_PORTABLE)
#define RP_X86_DISPATCH 1
__attribute__((target("avx2"))) static void
rp_targets_avx2(const uint32_t *restrict rb, uint32_t *restrict z,
                uint32_t i0, uint32_t nn, uint32_t cnt)
{
    RP_TARGETS_BODY
}
#endif

typedef void (*rp_targets_fn)(const uint32_t *restrict, uint32_t *restrict,
                              uint32_t, uint32_t, uint32_t);

static rp_targets_fn
rp_targets_pick(void)
{
#ifdef RP_X86_DISPATCH
    if (__builtin_cpu_supports("avx2")) {
        return rp_targets_avx2;
    }
#endif
    return rp_targets;
}

void
pd_randperm_targets(const uint32_t *rb, uint32_t *z, uint32_t i0, uint32_t nn,
                    uint32_t cnt)
{
    rp_targets_pick()(rb, z, i0, nn, cnt);
}

/* Forward Fisher-Yates over the uint32 r[0..n-1], n < PD_RANDPERM_THRESHOLD
 * (so every index fits in 32 bits): for i < n-1, swap r[i] and
 * r[i + random() % (n-i)]. */
static void
randperm_forward_u32(pd_mt19937 *g, uint32_t *r, int64_t n)
{
    uint32_t zb[2][RP_BATCH];
    uint32_t rb[RP_BATCH];
    uint32_t nn = (uint32_t)n;
    rp_targets_fn targets = rp_targets_pick();
    for (uint32_t i = 0; i < nn; i++) {
        r[i] = i;
    }
    if (nn < 2) {
        return;
    }
    uint32_t last = nn - 1; /* positions 0 .. n-2 swap */
    uint32_t start = 0, cnt = 0;
    int cur = 0;
    cnt = last < RP_BATCH ? last : RP_BATCH;
    mt_fill(g, rb, cnt);
    targets(rb, zb[0], 0, nn, cnt);
    for (uint32_t k = 0; k < cnt; k++) {
        PREFETCH_W(&r[zb[0][k]]);
    }
    while (cnt > 0) {
        uint32_t nstart = start + cnt;
        uint32_t left = last - nstart;
        uint32_t ncnt = left < RP_BATCH ? left : RP_BATCH;
        uint32_t *nz = zb[cur ^ 1];
        mt_fill(g, rb, ncnt);
        targets(rb, nz, nstart, nn, ncnt);
        for (uint32_t k = 0; k < ncnt; k++) {
            PREFETCH_W(&r[nz[k]]);
        }
        const uint32_t *z = zb[cur];
        for (uint32_t k = 0; k < cnt; k++) {
            uint32_t i = start + k;
            uint32_t sav = r[i];
            r[i] = r[z[k]];
            r[z[k]] = sav;
        }
        start = nstart;
        cnt = ncnt;
        cur ^= 1;
    }
}

/* The forward shuffle into an int64 array: shuffled as uint32 in the first
 * half of out (half the memory the random swaps touch), then widened in
 * place from the end (out[i] covers uint32 words 2i and 2i+1, which are
 * >= i: already read). */
static void
randperm_forward_i64(pd_mt19937 *g, int64_t *out, int64_t n)
{
    randperm_forward_u32(g, (uint32_t *)(void *)out, n);
    unsigned char *bytes = (unsigned char *)(void *)out;
    for (int64_t i = n - 1; i >= 0; i--) {
        uint32_t v;
        memcpy(&v, bytes + (size_t)i * sizeof v, sizeof v);
        int64_t w = (int64_t)v;
        memcpy(bytes + (size_t)i * sizeof w, &w, sizeof w);
    }
}

/* Inside-out Fisher-Yates (n >= PD_RANDPERM_THRESHOLD): for i < n,
 * z = random64() % (i+1); r[i] = r[z]; r[z] = i. */
static void
randperm_inside_out(pd_mt19937 *g, int64_t *r, int64_t n)
{
    uint64_t zb[2][RP_BATCH];
    uint64_t nn = (uint64_t)n;
    uint64_t start = 0, cnt, cur = 0;
    if (nn == 0) {
        return;
    }
    cnt = nn < RP_BATCH ? nn : RP_BATCH;
    for (uint64_t k = 0; k < cnt; k++) {
        zb[0][k] = mt_draw64(g) % (k + 1);
        PREFETCH_W(&r[zb[0][k]]);
    }
    while (cnt > 0) {
        uint64_t nstart = start + cnt;
        uint64_t left = nn - nstart;
        uint64_t ncnt = left < RP_BATCH ? left : RP_BATCH;
        uint64_t *nz = zb[cur ^ 1];
        for (uint64_t k = 0; k < ncnt; k++) {
            nz[k] = mt_draw64(g) % (nstart + k + 1);
            PREFETCH_W(&r[nz[k]]);
        }
        const uint64_t *z = zb[cur];
        for (uint64_t k = 0; k < cnt; k++) {
            uint64_t i = start + k;
            /* torch writes r[i] = i first, so z == i leaves i there. */
            r[i] = (z[k] == i) ? (int64_t)i : r[z[k]];
            r[z[k]] = (int64_t)i;
        }
        start = nstart;
        cnt = ncnt;
        cur ^= 1;
    }
}

void
pd_randperm_inside_out(pd_mt19937 *g, int64_t *out, int64_t n)
{
    if (n > 0) {
        randperm_inside_out(g, out, n);
    }
}

void
pd_randperm(pd_mt19937 *g, int64_t *out, int64_t n)
{
    if (n <= 0) {
        return;
    }
    if (n < PD_RANDPERM_THRESHOLD) {
        randperm_forward_i64(g, out, n);
    } else {
        randperm_inside_out(g, out, n);
    }
}

/* ------------------------------------------------------- randint, multinomial */

void
pd_randint(pd_mt19937 *g, int64_t *out, size_t count, uint64_t range,
           int64_t low)
{
    /* (val % range) + base in uint64 arithmetic, then cast: no signed
     * overflow, the same bits as torch's int64 result. */
    if (range >= ((uint64_t)1 << 32)) {
        for (size_t i = 0; i < count; i++) {
            out[i] = (int64_t)(mt_draw64(g) % range + (uint64_t)low);
        }
    } else {
        uint32_t r32 = (uint32_t)range;
        for (size_t i = 0; i < count; i++) {
            out[i] = (int64_t)((uint64_t)(mt_draw(g) % r32) + (uint64_t)low);
        }
    }
}

static inline double
uniform53(pd_mt19937 *g)
{
    /* uniform_real_distribution<double>(0, 1): 53 bits of random64. */
    return (double)(mt_draw64(g) & (((uint64_t)1 << 53) - 1)) *
           (1.0 / (double)((uint64_t)1 << 53));
}

void
pd_exponential(pd_mt19937 *g, double *out, size_t count, double lambd)
{
    for (size_t i = 0; i < count; i++) {
        out[i] = -1.0 / lambd * log1p(-uniform53(g));
    }
}

pd_status
pd_multinomial_replacement(pd_mt19937 *g, const double *weights, int64_t ncat,
                           int64_t *out, int64_t count)
{
    double *cum;
    double sum = 0.0;
    if (ncat <= 0) {
        return pd_error(PD_EINVAL, "multinomial: the weights must not be "
                        "empty");
    }
    cum = malloc((size_t)ncat * sizeof(double));
    if (cum == NULL) {
        return pd_error(PD_ENOMEM, "multinomial: cannot allocate %lld "
                        "doubles", (long long)ncat);
    }
    for (int64_t j = 0; j < ncat; j++) {
        double v = weights[j];
        if (!(v >= 0)) {
            free(cum);
            if (isnan(v)) {
                return pd_error(PD_EINVAL, "invalid multinomial distribution "
                                "(encountering probability entry = infinity "
                                "or NaN)");
            }
            return pd_error(PD_EINVAL, "invalid multinomial distribution "
                            "(encountering probability entry < 0)");
        }
        if (isinf(v)) {
            free(cum);
            return pd_error(PD_EINVAL, "invalid multinomial distribution "
                            "(encountering probability entry = infinity or "
                            "NaN)");
        }
        sum += v;
        cum[j] = sum;
    }
    if (!(sum > 0)) {
        free(cum);
        return pd_error(PD_EINVAL, "invalid multinomial distribution (sum of "
                        "probabilities <= 0)");
    }
    for (int64_t j = 0; j < ncat; j++) {
        cum[j] /= sum;
    }
    /* aten forces the last bucket to 1 before every search. */
    cum[ncat - 1] = 1.0;
    for (int64_t s = 0; s < count; s++) {
        double u = uniform53(g);
        int64_t lo = 0, hi = ncat;
        while (hi - lo > 0) {
            int64_t mid = lo + (hi - lo) / 2;
            if (cum[mid] < u) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        out[s] = lo;
    }
    free(cum);
    return PD_OK;
}

/* ------------------------------------------------- DistributedSampler */

/* Scratch for a permutation: big ones come from mmap with transparent huge
 * pages requested (as NumPy does for its arrays), which saves thousands of
 * page faults per epoch.  scratch_free needs the same size. */
#define SCRATCH_MMAP_MIN ((size_t)4 << 20)

static void *
scratch_alloc(size_t size)
{
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    if (size >= SCRATCH_MMAP_MIN) {
        void *p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return NULL;
        }
        (void)madvise(p, size, MADV_HUGEPAGE); /* a hint; failure is fine */
        return p;
    }
#endif
    return malloc(size ? size : 1);
}

static void
scratch_free(void *p, size_t size)
{
#if defined(MAP_ANONYMOUS) && defined(MADV_HUGEPAGE)
    if (size >= SCRATCH_MMAP_MIN) {
        munmap(p, size);
        return;
    }
#endif
    free(p);
}

int64_t
pd_dist_num_samples(int64_t len, int64_t num_replicas, int drop_last)
{
    if (drop_last && len % num_replicas != 0) {
        /* ceil((len - R) / R); len - R is in (-R, 0) when len < R -> 0. */
        int64_t a = len - num_replicas;
        if (a <= 0) {
            return 0;
        }
        return a / num_replicas + (a % num_replicas != 0);
    }
    return len / num_replicas + (len % num_replicas != 0);
}

pd_status
pd_dist_sampler_indices(int64_t len, int64_t num_replicas, int64_t rank,
                        int shuffle, uint64_t seed, int drop_last,
                        int64_t *out)
{
    if (len < 0) {
        return pd_error(PD_EINVAL, "dataset length must be >= 0, got %lld",
                        (long long)len);
    }
    if (num_replicas < 1) {
        return pd_error(PD_EINVAL, "num_replicas must be >= 1, got %lld",
                        (long long)num_replicas);
    }
    if (rank < 0 || rank >= num_replicas) {
        return pd_error(PD_EINVAL, "Invalid rank %lld, rank should be in the "
                        "interval [0, %lld]", (long long)rank,
                        (long long)(num_replicas - 1));
    }
    int64_t ns = pd_dist_num_samples(len, num_replicas, drop_last);
    if (ns == 0) {
        return PD_OK;
    }
    /* ns > 0 implies len > 0.  Position j of the padded list holds
     * perm[j % len] (whole copies from the start, then cut). */
    if (!shuffle) {
        for (int64_t k = 0; k < ns; k++) {
            int64_t j = rank + k * num_replicas;
            out[k] = j < len ? j : j % len;
        }
        return PD_OK;
    }
    pd_mt19937 g;
    pd_mt_seed(&g, seed);
    if (len < PD_RANDPERM_THRESHOLD) {
        size_t bytes = (size_t)len * sizeof(uint32_t);
        uint32_t *perm = scratch_alloc(bytes);
        if (perm == NULL) {
            return pd_error(PD_ENOMEM, "DistributedSampler: cannot allocate "
                            "a permutation of %lld indices", (long long)len);
        }
        randperm_forward_u32(&g, perm, len);
        for (int64_t k = 0; k < ns; k++) {
            int64_t j = rank + k * num_replicas;
            out[k] = (int64_t)perm[j < len ? j : j % len];
        }
        scratch_free(perm, bytes);
    } else {
        size_t bytes = (size_t)len * sizeof(int64_t);
        int64_t *perm = scratch_alloc(bytes);
        if (perm == NULL) {
            return pd_error(PD_ENOMEM, "DistributedSampler: cannot allocate "
                            "a permutation of %lld indices", (long long)len);
        }
        randperm_inside_out(&g, perm, len);
        for (int64_t k = 0; k < ns; k++) {
            int64_t j = rank + k * num_replicas;
            out[k] = perm[j < len ? j : j % len];
        }
        scratch_free(perm, bytes);
    }
    return PD_OK;
}
