/* Reduce through shared memory: the allreduce's rounds (copy in; sync; rank
 * r reduces slice r into its bank; sync) with only the root copying the
 * reduced slices out.  Small messages: copy in, one sync, the root reduces
 * every bank. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

/* as SHM_ALLREDUCE_SMALL (allreduce_shm.c) */
#define SHM_REDUCE_SMALL (8u << 10)

static void
slice(size_t m, int n, int p, size_t *lo, size_t *hi)
{
    size_t q = (m + (size_t)n - 1) / (size_t)n;
    q = (q + 15) & ~(size_t)15;
    *lo = (size_t)p * q < m ? (size_t)p * q : m;
    *hi = *lo + q < m ? *lo + q : m;
}

pd_status
pd_reduce_shm(pd_coll *c, const char *in, char *out, size_t count)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank, root = c->id.root;
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t per = pd_shm_bank_elems(c, esz);
    size_t bytes = count * esz;
    char *stack[16];
    char **src = n <= 16 ? stack : malloc(sizeof(char *) * (size_t)n);
    pd_status st = PD_OK;
    if (src == NULL) {
        return pd_error(PD_ENOMEM, "reduce: out of memory");
    }
    if (bytes <= SHM_REDUCE_SMALL && count <= per) {
        int b = pd_shm_copyin_bank(c);
        if (!c->resume) {
            memcpy(pd_shm_bank(s, r, b), in, bytes);
        }
        /* the leaves wait only for their left neighbour */
        PD_CHECK_GOTO(
            pd_shm_first_sync_from(c, r == root ? -1 : (r + n - 1) % n, 0),
            st, exit);
        if (r == root) {
            for (int p = 0; p < n; p++) {
                src[p] = pd_shm_bank(s, p, b);
            }
            pd_shm_reduce(c, out, src, n, count, 1);
        }
        goto exit;
    }
    size_t done = 0;
    size_t m = count < per ? count : per;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume) {
        memcpy(pd_shm_bank(s, r, b), in, m * esz);
    }
    PD_CHECK_GOTO(pd_shm_first_sync(c), st, exit);
    for (;;) {
        size_t lo, hi;
        slice(m, n, r, &lo, &hi);
        src[0] = pd_shm_bank(s, r, b) + lo * esz;
        for (int i = 1; i < n; i++) {
            src[i] = pd_shm_bank(s, (r + i) % n, b) + lo * esz;
        }
        pd_shm_reduce(c, src[0], src, n, hi - lo, 1);
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        if (r == root) {
            for (int p = 0; p < n; p++) {
                slice(m, n, p, &lo, &hi);
                memcpy(out + (done + lo) * esz,
                       pd_shm_bank(s, p, b) + lo * esz, (hi - lo) * esz);
            }
        }
        done += m;
        size_t m2 = count - done < per ? count - done : per;
        if (m2 == 0) {
            break;
        }
        b = pd_shm_next_bank(s);
        memcpy(pd_shm_bank(s, r, b), in + done * esz, m2 * esz);
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        m = m2;
    }
exit:
    if (src != stack) {
        free(src);
    }
    return st;
}
