/* Allreduce (and reduce) through shared memory.
 *
 * Small: every rank copies its input into its bank, one sync, and every rank
 * reduces all banks in rank order into its output (identical on all ranks).
 * Large: rounds of one bank per rank.  Copy in; sync; rank r reduces slice r
 * of all banks into its own bank; sync; every rank copies every slice out,
 * while copying the next round's input into its other bank.  The banks stay
 * small, so the data read in one phase was written moments before by
 * another core and comes from cache.
 */
#include <string.h>

#include "coll.h"

/* Largest message of the one-round algorithm (bytes).  Measured (2 ranks,
 * float32, median us, one-round / two-round): 8 KiB 1.34 / 1.32, 16 KiB
 * 1.89 / 1.67, 32 KiB 3.14 / 2.40, 64 KiB 5.41 / 3.88: from 16 KiB on,
 * every rank reducing every bank costs more than the second sync. */
#define SHM_ALLREDUCE_SMALL (8u << 10)

static void
slice(size_t m, int n, int p, size_t *lo, size_t *hi)
{
    size_t q = (m + (size_t)n - 1) / (size_t)n;
    q = (q + 15) & ~(size_t)15;
    *lo = (size_t)p * q < m ? (size_t)p * q : m;
    *hi = *lo + q < m ? *lo + q : m;
}

/* Copy m elements into the bank, except my own slice (nobody reads it). */
static void
copy_in(char *bank, const char *in, size_t m, int n, int r, size_t esz)
{
    size_t lo, hi;
    slice(m, n, r, &lo, &hi);
    pd_copy(bank, in, lo * esz);
    pd_copy(bank + hi * esz, in + hi * esz, (m - hi) * esz);
}

typedef struct rounds {
    const char *in;
    char *out;
    char **src;
    size_t esz;
    int stream;
} rounds;

/* One round: every rank reduces every bank (in rank order) into its
 * output. */
static void
small_fill(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rounds *x = ctx;
    pd_copy(pd_shm_bank(c->shm, c->rank, b), x->in + done * x->esz,
           m * x->esz);
}

static void
small_drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rounds *x = ctx;
    for (int p = 0; p < c->size; p++) {
        x->src[p] = pd_shm_bank(c->shm, p, b);
    }
    pd_shm_reduce(c, x->out + done * x->esz, x->src, c->size, m, 1);
}

static const pd_shm_round_ops small_all = {.fill = small_fill,
                                           .drain = small_drain};
static const pd_shm_round_ops small_leaf = {.fill = small_fill};

static void
fill(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rounds *x = ctx;
    copy_in(pd_shm_bank(c->shm, c->rank, b), x->in + done * x->esz, m,
            c->size, c->rank, x->esz);
}

/* my slice: my input (never copied in) with every peer's bank, into my bank
 * where the peers fetch it */
static void
reduce(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rounds *x = ctx;
    int n = c->size, r = c->rank;
    size_t lo, hi;
    slice(m, n, r, &lo, &hi);
    x->src[0] = (char *)x->in + (done + lo) * x->esz;
    for (int i = 1; i < n; i++) {
        x->src[i] = pd_shm_bank(c->shm, (r + i) % n, b) + lo * x->esz;
    }
    pd_shm_reduce(c, pd_shm_bank(c->shm, r, b) + lo * x->esz, x->src, n,
                  hi - lo, 1);
}

/* every slice out, starting with the next rank's */
static void
drain(pd_coll *c, void *ctx, int b, size_t done, size_t m)
{
    rounds *x = ctx;
    int n = c->size, r = c->rank;
    for (int i = 1; i <= n; i++) {
        int p = (r + i) % n;
        size_t lo, hi;
        slice(m, n, p, &lo, &hi);
        pd_copy_out(x->out + (done + lo) * x->esz,
                    pd_shm_bank(c->shm, p, b) + lo * x->esz,
                    (hi - lo) * x->esz, x->stream);
    }
}

static const pd_shm_round_ops large_all = {.fill = fill, .reduce = reduce,
                                           .drain = drain};
static const pd_shm_round_ops large_leaf = {.fill = fill, .reduce = reduce};

/* Allreduce (root < 0) or reduce to root: the rounds are the same, only
 * who copies the reduced slices out differs. */
pd_status
pd_shm_reduce_rounds(pd_coll *c, const char *in, char *out, size_t count,
                     int root)
{
    int gets = root < 0 || c->rank == root; /* this rank gets the result */
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t per = pd_shm_bank_elems(c, esz);
    size_t bytes = count * esz;
    char *stack[PD_SHM_STACK_RANKS];
    rounds x = {in, out, pd_shm_ptrs(c, stack), esz, 0};
    pd_status st;
    if (x.src == NULL) {
        return PD_ENOMEM;
    }
    if (bytes <= SHM_ALLREDUCE_SMALL && count <= per) {
        /* reduce: a leaf waits only for the first other rank to arrive */
        st = gets ? pd_shm_rounds(c, &small_all, &x, count, per, -1, 0)
                  : pd_shm_rounds(c, &small_leaf, &x, count, per,
                                  PD_SHM_ANY, 0);
    }
    else {
        x.stream = bytes >= 4 * pd_shm_stream_bytes();
        st = gets ? pd_shm_rounds(c, &large_all, &x, count, per, -1, 0)
                  : pd_shm_rounds(c, &large_leaf, &x, count, per, -1, 0);
    }
    pd_shm_ptrs_free(x.src, stack);
    return st;
}

pd_status
pd_allreduce_shm(pd_coll *c, const char *in, char *out, size_t count)
{
    return pd_shm_reduce_rounds(c, in, out, count, -1);
}

/* Buffers in shared memory: rank r reduces slice r of every rank's buffer
 * into its own, then gathers the other slices, into its buffer (out NULL) or
 * into out (its reduced slice copied there too). */
static pd_status
shared_rounds(pd_coll *c, char *const *peer, char *out, size_t count)
{
    int n = c->size, r = c->rank;
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t per = pd_shm_bank_elems(c, esz);
    char *stack[PD_SHM_STACK_RANKS];
    char **src = pd_shm_ptrs(c, stack);
    pd_status st = PD_OK;
    if (src == NULL) {
        return PD_ENOMEM;
    }
    /* every rank's buffer holds its input */
    PD_CHECK_GOTO(pd_shm_first_sync(c), st, exit);
    size_t prev = 0, prev_m = 0;
    for (size_t done = 0;; done += per) {
        size_t m = done < count ? (count - done < per ? count - done : per)
                                : 0;
        size_t lo, hi;
        if (m > 0) {
            /* reduce my slice of this chunk into my own buffer */
            slice(m, n, r, &lo, &hi);
            src[0] = peer[r] + (done + lo) * esz;
            for (int i = 1; i < n; i++) {
                src[i] = peer[(r + i) % n] + (done + lo) * esz;
            }
            pd_shm_reduce(c, src[0], src, n, hi - lo, 1);
            if (out != NULL) {
                pd_copy(out + (done + lo) * esz, src[0], (hi - lo) * esz);
            }
        }
        if (prev_m > 0) {
            /* gather the other slices of the previous chunk */
            char *dst = out != NULL ? out : peer[r];
            for (int i = 1; i < n; i++) {
                int p = (r + i) % n;
                slice(prev_m, n, p, &lo, &hi);
                pd_copy(dst + (prev + lo) * esz, peer[p] + (prev + lo) * esz,
                       (hi - lo) * esz);
            }
        }
        /* after the last gather: nobody reads my buffer any more */
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        if (m == 0) {
            break;
        }
        prev = done;
        prev_m = m;
    }
exit:
    pd_shm_ptrs_free(src, stack);
    return st;
}

pd_status
pd_allreduce_shm_inplace(pd_coll *c, char *const *peer, size_t count)
{
    return shared_rounds(c, peer, NULL, count);
}

pd_status
pd_allreduce_shm_into(pd_coll *c, char *const *peer, char *out, size_t count)
{
    return shared_rounds(c, peer, out, count);
}
