/* Reduce-scatter through shared memory: per round every rank copies a piece
 * of each of the other ranks' blocks into its bank (one region per
 * destination), one sync, and rank r reduces region r of every bank with its
 * own block straight from its input. */
#include <stdlib.h>
#include <string.h>

#include "coll.h"

pd_status
pd_reduce_scatter_shm(pd_coll *c, char **in, char *out, size_t count)
{
    pd_shm *s = c->shm;
    int n = c->size, r = c->rank;
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    size_t pe = (pd_shm_bank_elems(c, esz) / (size_t)n) & ~(size_t)15;
    char *stack[16];
    char **src = n <= 16 ? stack : malloc(sizeof(char *) * (size_t)n);
    pd_status st = PD_OK;
    if (src == NULL) {
        return pd_error(PD_ENOMEM, "reduce_scatter: out of memory");
    }
    if (pe == 0) {
        pe = 1;
    }
    size_t done = 0;
    size_t m = count < pe ? count : pe;
    int b = pd_shm_copyin_bank(c);
    if (!c->resume) {
        for (int p = 0; p < n; p++) {
            if (p != r) {
                memcpy(pd_shm_bank(s, r, b) + (size_t)p * pe * esz, in[p],
                       m * esz);
            }
        }
    }
    PD_CHECK_GOTO(pd_shm_first_sync(c), st, exit);
    for (;;) {
        src[0] = in[r] + done * esz;
        for (int i = 1; i < n; i++) {
            src[i] = pd_shm_bank(s, (r + i) % n, b) + (size_t)r * pe * esz;
        }
        /* out may alias in[r] (src[0]) only */
        pd_shm_reduce(c, out + done * esz, src, n, m, 1);
        done += m;
        size_t m2 = count - done < pe ? count - done : pe;
        if (m2 == 0) {
            break;
        }
        b = pd_shm_next_bank(s);
        for (int p = 0; p < n; p++) {
            if (p != r) {
                memcpy(pd_shm_bank(s, r, b) + (size_t)p * pe * esz,
                       in[p] + done * esz, m2 * esz);
            }
        }
        PD_CHECK_GOTO(pd_shm_next_sync(c), st, exit);
        m = m2;
    }
exit:
    if (src != stack) {
        free(src);
    }
    return st;
}
