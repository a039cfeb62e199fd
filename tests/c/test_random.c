/* csrc/kernels/random.c against independent references: the C++ standard's
 * check value for std::mt19937, a textbook MT19937 (Matsumoto & Nishimura's
 * init_genrand / genrand_int32, written out here), and naive one-draw-at-a-
 * time versions of torch's two randperm shuffles, DistributedSampler's
 * pad-and-stride rule, randint and multinomial's inverse-CDF search. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/random.h"
#include "pd_test.h"

/* ---- textbook MT19937 ---- */
typedef struct {
    uint32_t mt[624];
    int mti;
} ref_mt;

static void
ref_seed(ref_mt *r, uint32_t s)
{
    r->mt[0] = s;
    for (r->mti = 1; r->mti < 624; r->mti++) {
        r->mt[r->mti] = 1812433253u * (r->mt[r->mti - 1] ^
                                       (r->mt[r->mti - 1] >> 30)) +
                        (uint32_t)r->mti;
    }
}

static uint32_t
ref_next(ref_mt *r)
{
    static const uint32_t mag01[2] = {0u, 0x9908b0dfu};
    uint32_t y;
    if (r->mti >= 624) {
        int kk;
        for (kk = 0; kk < 624 - 397; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + 397] ^ (y >> 1) ^ mag01[y & 1u];
        }
        for (; kk < 623; kk++) {
            y = (r->mt[kk] & 0x80000000u) | (r->mt[kk + 1] & 0x7fffffffu);
            r->mt[kk] = r->mt[kk + (397 - 624)] ^ (y >> 1) ^ mag01[y & 1u];
        }
        y = (r->mt[623] & 0x80000000u) | (r->mt[0] & 0x7fffffffu);
        r->mt[623] = r->mt[396] ^ (y >> 1) ^ mag01[y & 1u];
        r->mti = 0;
    }
    y = r->mt[r->mti++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

static uint64_t
ref_next64(ref_mt *r)
{
    uint64_t hi = ref_next(r);
    return (hi << 32) | ref_next(r);
}

static void
test_cpp_standard_value(void)
{
    /* [rand.predef]: the 10000th output of a default-constructed
     * std::mt19937 (seed 5489) is 4123659995. */
    pd_mt19937 g;
    uint32_t v = 0;
    pd_mt_seed(&g, 5489);
    for (int i = 0; i < 10000; i++) {
        v = pd_mt_random(&g);
    }
    T_CHECK(v == 4123659995u);
}

static void
test_engine_vs_textbook(void)
{
    const uint64_t seeds[] = {0, 1, 42, 0xffffffffu, 0x100000001ull,
                              0xffffffffffffffffull};
    for (size_t s = 0; s < sizeof(seeds) / sizeof(seeds[0]); s++) {
        pd_mt19937 g;
        ref_mt r;
        pd_mt_seed(&g, seeds[s]);
        ref_seed(&r, (uint32_t)seeds[s]);
        T_CHECK(g.seed == seeds[s] && pd_mt_valid(&g));
        int bad = 0;
        for (int i = 0; i < 3000; i++) {
            bad += pd_mt_random(&g) != ref_next(&r);
        }
        for (int i = 0; i < 1000; i++) {
            bad += pd_mt_random64(&g) != ref_next64(&r);
        }
        T_CHECK(bad == 0);
    }
}

/* Naive forward (n < threshold) and inside-out shuffles, one draw at a time
 * from the textbook engine. */
static void
ref_forward(uint32_t seed, int64_t *r, int64_t n)
{
    ref_mt m;
    ref_seed(&m, seed);
    for (int64_t i = 0; i < n; i++) {
        r[i] = i;
    }
    for (int64_t i = 0; i < n - 1; i++) {
        int64_t z = (int64_t)(ref_next(&m) % (uint64_t)(n - i));
        int64_t t = r[i];
        r[i] = r[z + i];
        r[z + i] = t;
    }
}

static void
ref_inside_out(uint32_t seed, int64_t *r, int64_t n)
{
    ref_mt m;
    ref_seed(&m, seed);
    for (int64_t i = 0; i < n; i++) {
        int64_t z = (int64_t)(ref_next64(&m) % (uint64_t)(i + 1));
        r[i] = i;
        r[i] = r[z];
        r[z] = i;
    }
}

static void
test_randperm_both_algorithms(void)
{
    const int64_t sizes[] = {0, 1, 2, 3, 63, 64, 65, 129, 623, 624, 625,
                             1000, 4099, 100003};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        int64_t n = sizes[k];
        int64_t *a = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        int64_t *b = malloc((size_t)(n ? n : 1) * sizeof(int64_t));
        for (uint32_t seed = 0; seed < 3; seed++) {
            pd_mt19937 g;
            pd_mt_seed(&g, seed);
            pd_randperm(&g, a, n);
            ref_forward(seed, b, n);
            T_CHECK(memcmp(a, b, (size_t)n * sizeof(int64_t)) == 0);
            /* the generator advanced by exactly n - 1 draws */
            ref_mt m;
            ref_seed(&m, seed);
            for (int64_t i = 0; i < n - 1; i++) {
                ref_next(&m);
            }
            T_CHECK(pd_mt_random(&g) == ref_next(&m));

            pd_mt_seed(&g, seed);
            pd_randperm_inside_out(&g, a, n);
            ref_inside_out(seed, b, n);
            T_CHECK(memcmp(a, b, (size_t)n * sizeof(int64_t)) == 0);
        }
        free(a);
        free(b);
    }
}

/* The division-free remainders of the forward shuffle's swap targets
 * against %, at the extremes of both operands (draws near 2^32, divisors
 * from 2 to nearly 2^31) and at random ones. */
static void
test_randperm_targets_exact(void)
{
    const uint32_t divs[] = {2, 3, 5, 7, 1000, 65535, 65536, 65537,
                             (1u << 24) + 1, 214748363u, 214748364u,
                             (1u << 30) + 7, (1u << 31) - 2000};
    uint32_t rb[64], z[64];
    pd_mt19937 g;
    pd_mt_seed(&g, 11);
    long bad = 0;
    for (int it = 0; it < 20000; it++) {
        for (int k = 0; k < 64; k++) {
            rb[k] = (it % 3 == 0) ? 0xffffffffu - (uint32_t)(k * (it % 5))
                    : (it % 3 == 1) ? (uint32_t)k * (uint32_t)(it % 7)
                                    : pd_mt_random(&g);
        }
        uint32_t d_last;
        if (it < 13 * 100) {
            d_last = divs[it % 13];
        } else {
            d_last = (pd_mt_random(&g) >> (pd_mt_random(&g) % 31)) | 2u;
            if (d_last > (1u << 31) - 2000) {
                d_last = (1u << 31) - 2000;
            }
        }
        /* positions i0 .. i0+63 of a shuffle of nn < 2^31: divisors
         * d_last+63 down to d_last (>= 2) */
        uint32_t nn = (uint32_t)((1u << 31) - 1);
        uint32_t i0 = nn - d_last - 63;
        pd_randperm_targets(rb, z, i0, nn, 64);
        for (uint32_t k = 0; k < 64; k++) {
            uint32_t i = i0 + k;
            bad += z[k] != i + rb[k] % (nn - i);
        }
        nn = d_last + 63 + (uint32_t)(it % 1000);
        i0 = nn - d_last - 63;
        pd_randperm_targets(rb, z, i0, nn, 64);
        for (uint32_t k = 0; k < 64; k++) {
            uint32_t i = i0 + k;
            bad += z[k] != i + rb[k] % (nn - i);
        }
    }
    T_CHECK(bad == 0);
}

static void
test_dist_sampler_indices(void)
{
    int64_t perm[200], out[400], want[400];
    int cases = 0;
    for (int64_t len = 0; len <= 40; len += (len < 12 ? 1 : 7)) {
        for (int64_t R = 1; R <= 9; R += 2) {
            for (int drop = 0; drop <= 1; drop++) {
                for (int sh = 0; sh <= 1; sh++) {
                    int64_t ns = pd_dist_num_samples(len, R, drop);
                    /* torch: ceil((len - R) / R) with drop_last and a
                     * remainder, else ceil(len / R) (as doubles). */
                    double want_ns = (drop && len % R) ?
                        ceil((double)(len - R) / (double)R) :
                        ceil((double)len / (double)R);
                    T_CHECK(ns == (int64_t)want_ns);
                    if (sh) {
                        ref_forward(1234 + 5, perm, len);
                    } else {
                        for (int64_t i = 0; i < len; i++) {
                            perm[i] = i;
                        }
                    }
                    for (int64_t rank = 0; rank < R; rank++) {
                        T_OK(pd_dist_sampler_indices(len, R, rank, sh,
                                                     1234 + 5, drop, out));
                        /* padded list: the permutation repeated, cut to
                         * ns * R; rank takes positions rank, rank + R, ... */
                        for (int64_t k = 0; k < ns; k++) {
                            want[k] = perm[(rank + k * R) % len];
                        }
                        T_CHECK(memcmp(out, want, (size_t)ns * 8) == 0);
                        cases++;
                    }
                }
            }
        }
    }
    T_CHECK(cases > 500);
    T_ST(pd_dist_sampler_indices(10, 4, 4, 1, 0, 0, out), PD_EINVAL);
    T_MSG_HAS("Invalid rank 4, rank should be in the interval [0, 3]");
    T_ST(pd_dist_sampler_indices(10, 0, 0, 1, 0, 0, out), PD_EINVAL);
    T_ST(pd_dist_sampler_indices(-1, 2, 0, 1, 0, 0, out), PD_EINVAL);
}

static void
test_randint_and_multinomial(void)
{
    pd_mt19937 g;
    ref_mt m;
    int64_t out[100];
    pd_mt_seed(&g, 7);
    ref_seed(&m, 7);
    pd_randint(&g, out, 100, 10, -3);
    int bad = 0;
    for (int i = 0; i < 100; i++) {
        bad += out[i] != (int64_t)(ref_next(&m) % 10) - 3;
    }
    pd_randint(&g, out, 50, (uint64_t)1 << 40, 5);
    for (int i = 0; i < 50; i++) {
        bad += out[i] != (int64_t)(ref_next64(&m) % ((uint64_t)1 << 40)) + 5;
    }
    T_CHECK(bad == 0);

    const double w[5] = {0.5, 0.0, 2.0, 1.0, 0.5};
    const double cum[5] = {0.125, 0.125, 0.625, 0.875, 1.0};
    pd_mt_seed(&g, 3);
    ref_seed(&m, 3);
    T_OK(pd_multinomial_replacement(&g, w, 5, out, 100));
    bad = 0;
    for (int i = 0; i < 100; i++) {
        double u = (double)(ref_next64(&m) & ((1ull << 53) - 1)) /
                   9007199254740992.0;
        int64_t k = 0;
        while (cum[k] < u) {
            k++;
        }
        bad += out[i] != k;
        bad += out[i] == 1; /* zero weight never drawn */
    }
    T_CHECK(bad == 0);
    const double neg[2] = {1.0, -1.0}, zero[2] = {0.0, 0.0},
                 inf[2] = {1.0, INFINITY};
    T_ST(pd_multinomial_replacement(&g, neg, 2, out, 2), PD_EINVAL);
    T_MSG_HAS("probability entry < 0");
    T_ST(pd_multinomial_replacement(&g, zero, 2, out, 2), PD_EINVAL);
    T_MSG_HAS("sum of probabilities <= 0");
    T_ST(pd_multinomial_replacement(&g, inf, 2, out, 2), PD_EINVAL);
    T_MSG_HAS("infinity or NaN");

    double e[64];
    pd_mt_seed(&g, 11);
    ref_seed(&m, 11);
    pd_exponential(&g, e, 64, 2.0);
    bad = 0;
    for (int i = 0; i < 64; i++) {
        double u = (double)(ref_next64(&m) & ((1ull << 53) - 1)) /
                   9007199254740992.0;
        bad += e[i] != -1.0 / 2.0 * log1p(-u);
    }
    T_CHECK(bad == 0);
}

int
main(void)
{
    T_RUN(test_cpp_standard_value);
    T_RUN(test_engine_vs_textbook);
    T_RUN(test_randperm_both_algorithms);
    T_RUN(test_randperm_targets_exact);
    T_RUN(test_dist_sampler_indices);
    T_RUN(test_randint_and_multinomial);
    return pd_test_result();
}
