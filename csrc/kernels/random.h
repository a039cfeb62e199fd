/* torch-compatible CPU random numbers: the mt19937 engine of
 * aten/src/ATen/core/MT19937RNGEngine.h, torch's CPU randperm, and the index
 * lists of torch.utils.data.DistributedSampler, bit for bit.
 *
 * The engine is exactly std::mt19937; the seed is a uint64 of which only the
 * low 32 bits seed the state (init_genrand), the full value is kept as the
 * generator's initial seed.  Every function here is deterministic given the
 * engine's state and touches no global state.
 */
#ifndef PD_KERNELS_RANDOM_H
#define PD_KERNELS_RANDOM_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

#define PD_MT_N 624
#define PD_MT_M 397

/* torch switches randperm from 32-bit forward Fisher-Yates to 64-bit
 * inside-out Fisher-Yates at n >= UINT32_MAX / 20. */
#define PD_RANDPERM_THRESHOLD ((int64_t)(UINT32_MAX / 20))

/* Same fields as at::mt19937_data_pod. */
typedef struct pd_mt19937 {
    uint64_t seed;
    int32_t left;       /* outputs left before the next twist, 1..624 */
    int32_t seeded;
    uint32_t next;      /* index of the next state word, 0..624 */
    uint32_t state[PD_MT_N];
} pd_mt19937;

/* Seed like at::mt19937(seed): state from the low 32 bits, seed kept whole. */
void pd_mt_seed(pd_mt19937 *g, uint64_t seed);

/* 1 when (left, next, seeded) are in range (at::mt19937::is_valid). */
int pd_mt_valid(const pd_mt19937 *g);

/* One 32-bit output (CPUGeneratorImpl::random). */
uint32_t pd_mt_random(pd_mt19937 *g);

/* (first << 32) | second (CPUGeneratorImpl::random64). */
uint64_t pd_mt_random64(pd_mt19937 *g);

/* torch.randperm(n, generator=g) into out[0..n-1] (n >= 0). */
void pd_randperm(pd_mt19937 *g, int64_t *out, int64_t n);

/* The swap targets of the forward shuffle (exposed for tests):
 * z[k] = i + rb[k] % (nn - i) for i = i0 + k, k < cnt; needs
 * nn < 2^31 and nn - i >= 2 (computed without integer division). */
void pd_randperm_targets(const uint32_t *rb, uint32_t *z, uint32_t i0,
                         uint32_t nn, uint32_t cnt);

/* The inside-out shuffle randperm uses from PD_RANDPERM_THRESHOLD on, for
 * any n >= 0 (so that tests can check it on small n). */
void pd_randperm_inside_out(pd_mt19937 *g, int64_t *out, int64_t n);

/* torch.randint(low, low + range, (count,), dtype=int64, generator=g):
 * out[i] = low + random() % range for range < 2^32, random64() % range
 * otherwise.  range >= 1. */
void pd_randint(pd_mt19937 *g, int64_t *out, size_t count, uint64_t range,
                int64_t low);

/* torch.multinomial(weights, count, replacement=True, generator=g) for a 1-d
 * double weight vector with count >= 2 (aten's CPU cumulative-distribution
 * path; one 53-bit uniform double per draw).  PD_EINVAL (message) for a
 * negative, non-finite or all-zero weight vector. */
pd_status pd_multinomial_replacement(pd_mt19937 *g, const double *weights,
                                     int64_t ncat, int64_t *out,
                                     int64_t count);

/* Tensor.exponential_(lambd, generator=g) for float64 on the CPU:
 * out[i] = -1 / lambd * log1p(-u), u a 53-bit uniform double per element
 * (what torch.multinomial without replacement draws). */
void pd_exponential(pd_mt19937 *g, double *out, size_t count, double lambd);

/* DistributedSampler's num_samples for a dataset of length len. */
int64_t pd_dist_num_samples(int64_t len, int64_t num_replicas, int drop_last);

/* The indices DistributedSampler(len, num_replicas, rank, shuffle, seed,
 * drop_last) yields for its rank: the permutation (randperm with a generator
 * seeded with seed, the caller adds the epoch) or 0..len-1, padded by
 * repetition or cut to total_size, then every num_replicas-th from rank.
 * out holds pd_dist_num_samples(...) elements.  PD_EINVAL for bad arguments,
 * PD_ENOMEM if the permutation's scratch buffer cannot be allocated. */
pd_status pd_dist_sampler_indices(int64_t len, int64_t num_replicas,
                                  int64_t rank, int shuffle, uint64_t seed,
                                  int drop_last, int64_t *out);

#endif
