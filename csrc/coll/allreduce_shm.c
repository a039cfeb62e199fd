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
#include <stdlib.h>
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
    memcpy(bank, in, lo * esz);
    memcpy(bank + hi * esz, in + hi * esz, (m - hi) * esz);
}

/* Allreduce (root < 0) or reduce to root: the rounds are the same, only
 * who copies the reduced slices out differs. */
pd_status
pd_shm_reduce_rounds(pd_coll *c, const char *in, char *out, size_t count,
                     int root)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank;
    int gets = root < 0 || r == root; /* this rank receives the result */
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t per = pd_shm_bank_elems(c, esz);
    size_t bytes = count * esz;
    char *stack[16];
    char **src = n <= 16 ? stack : malloc(sizeof(char *) * (size_t)n);
    pd_status st = PD_OK;
    if (src == NULL) {
        return pd_error(PD_ENOMEM, "%s: out of memory", c->op->name);
    }
    if (bytes <= SHM_ALLREDUCE_SMALL && count <= per) {
        int b = pd_shm_copyin_bank(c);
        if (!c->resume) {
            memcpy(pd_shm_bank(s, r, b), in, bytes);
        }
        /* reduce: a leaf waits only for the first other rank to arrive */
        PD_CHECK_GOTO(pd_shm_first_sync_from(c, gets ? -1 : PD_SHM_ANY, 0),
                      st, exit);
        if (gets) {
            for (int p = 0; p < n; p++) {
                src[p] = pd_shm_bank(s, p, b);
            }
            pd_shm_reduce(c, out, src, n, count, 1);
        }
        goto exit;
    }
    size_t done = 0;
    size_t m = count < per ? count : per;
    int stream = bytes >= 4 * pd_shm_stream_bytes();
    int b = pd_shm_copyin_bank(c);
    if (!c->resume) {
        copy_in(pd_shm_bank(s, r, b), in, m, n, r, esz);
    }
    PD_CHECK_GOTO(pd_shm_first_sync(c), st, exit);
    for (;;) {
        size_t lo, hi;
        slice(m, n, r, &lo, &hi);
        /* my slice: my input (never copied in) with every peer's bank,
         * into my bank where the peers fetch it */
        src[0] = (char *)in + (done + lo) * esz;
        for (int i = 1; i < n; i++) {
            src[i] = pd_shm_bank(s, (r + i) % n, b) + lo * esz;
        }
        pd_shm_reduce(c, pd_shm_bank(s, r, b) + lo * esz, src, n, hi - lo, 1);
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        /* every slice out, starting with the next rank's */
        for (int i = 1; i <= n && gets; i++) {
            int p = (r + i) % n;
            slice(m, n, p, &lo, &hi);
            pd_copy_out(out + (done + lo) * esz,
                        pd_shm_bank(s, p, b) + lo * esz, (hi - lo) * esz,
                        stream);
        }
        done += m;
        size_t m2 = count - done < per ? count - done : per;
        if (m2 == 0) {
            break;
        }
        b = pd_shm_next_bank(s);
        copy_in(pd_shm_bank(s, r, b), in + done * esz, m2, n, r, esz);
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        m = m2;
    }
exit:
    if (src != stack) {
        free(src);
    }
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
    char *stack[16];
    char **src = n <= 16 ? stack : malloc(sizeof(char *) * (size_t)n);
    pd_status st = PD_OK;
    if (src == NULL) {
        return pd_error(PD_ENOMEM, "all_reduce: out of memory");
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
                memcpy(out + (done + lo) * esz, src[0], (hi - lo) * esz);
            }
        }
        if (prev_m > 0) {
            /* gather the other slices of the previous chunk */
            char *dst = out != NULL ? out : peer[r];
            for (int i = 1; i < n; i++) {
                int p = (r + i) % n;
                slice(prev_m, n, p, &lo, &hi);
                memcpy(dst + (prev + lo) * esz, peer[p] + (prev + lo) * esz,
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
    if (src != stack) {
        free(src);
    }
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
