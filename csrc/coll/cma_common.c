/* Helpers shared by the single-copy algorithms (coll/<collective>_cma.c):
 * every rank publishes the addresses of its user buffers in its bank (a
 * table of in[size], len[size], out[size] words), one sync, the ranks move
 * bytes straight between each other's buffers with cross-memory attach
 * (transport/shm/cma.h), and a last sync tells every owner that nobody
 * reads or writes its buffers any more. */
#include <stdint.h>
#include <string.h>

#include "coll.h"
#include "rules.h"

int
pd_cma_use(pd_coll *c, size_t bytes)
{
    return pd_cma_possible(c) && c->inshm == NULL &&
           pd_rules_cma(c->rules, c->id.kind, bytes);
}

int
pd_cma_possible(const pd_coll *c)
{
    return pd_shm_cma(c->shm) &&
           (size_t)c->size * 3 * sizeof(uint64_t) <=
               pd_shm_bank_size(c->shm);
}

uint64_t *
pd_cma_table(pd_coll *c, int p, int b)
{
    return (uint64_t *)(void *)pd_shm_bank(c->shm, p, b);
}

pd_status
pd_cma_begin(pd_coll *c, const pd_cma_pub *pub, int *bank)
{
    int n = c->size;
    int b = pd_shm_copyin_bank(c);
    *bank = b;
    if (!c->resume) {
        uint64_t *t = pd_cma_table(c, c->rank, b);
        memset(t, 0, sizeof(uint64_t) * 3 * (size_t)n);
        for (int p = 0; p < n; p++) {
            if (pub->in != NULL) {
                t[PD_CMA_IN(n, p)] =
                    (uint64_t)(uintptr_t)pub->in[pub->in_each ? p : 0];
            }
            if (pub->in_len != NULL) {
                t[PD_CMA_LEN(n, p)] = pub->in_len[p];
            }
            if (pub->out != NULL) {
                t[PD_CMA_OUT(n, p)] =
                    (uint64_t)(uintptr_t)pub->out[pub->out_each ? p : 0];
            }
        }
    }
    return pd_shm_first_sync(c);
}

pd_status
pd_cma_end(pd_coll *c)
{
    return pd_shm_next_sync(c);
}

/* Bytes of one chunk of a reduction: each peer's piece and the result stay
 * in this core's caches between the read, the reduction and the writes.
 * Fewer, larger chunks pay the system calls and page pinning of
 * cross-memory attach less often: 2 MiB of pieces in all, but at least
 * 128 KiB each.  2 ranks: 512 KiB chunks were 10-15% faster than 128 KiB
 * from 16 MiB (2-core EPYC, 512 KiB of L2 per core); 1 MiB chunks, on
 * arrays on huge pages (as torch's under THP_MEM_ALLOC_ENABLE=1), against
 * 512 KiB, alternating runs, Open MPI in the same processes: all_reduce
 * 2 MiB 108-129 us against 131 (Open MPI 107-127 and 119-121), 4 MiB 218-245
 * against 227-228, reduce 8 MiB 608-628 against 708-775 and 16 MiB 1354-1377
 * against 1512-1518; 2 MiB chunks no better than 1 MiB, worse at 16 MiB.
 * 4 ranks sharing 2 cores: no difference beyond the noise. */
static size_t
cma_chunk(int n)
{
    size_t c = ((size_t)2 << 20) / (size_t)(n > 0 ? n : 1);
    return c < ((size_t)128 << 10) ? (size_t)128 << 10 : c & ~(size_t)4095;
}

pd_status
pd_cma_reduce(pd_coll *c, const pd_cma_red *x, size_t count)
{
    int n = c->size, r = c->rank;
    size_t esz = pd_dtype_size((pd_dtype)c->id.dtype);
    const size_t chunk = cma_chunk(n);
    size_t per = chunk / esz;
    char *stack[PD_SHM_STACK_RANKS];
    char **src = pd_shm_ptrs(c, stack);
    if (src == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = PD_OK;
    char *scratch = pd_shm_scratch(c->shm, chunk * (size_t)n);
    if (scratch == NULL) {
        st = PD_ENOMEM;
        goto out;
    }
    /* The kernels read and write whole elements, so this rank's own input
     * and result must be aligned to their element type (the peers' pieces
     * land in scratch, which is).  A user array that is not (a view at an
     * odd byte offset) goes through scratch's slot 0, unused otherwise:
     * copied in before, copied out after.  A local choice: the exchange
     * with the peers is the same either way. */
    size_t align = esz > 8 ? 8 : esz; /* complex: per component */
    int mine_odd = ((uintptr_t)x->mine % align) != 0;
    int res_odd = x->res != NULL && ((uintptr_t)x->res % align) != 0;
    for (size_t done = 0; done < count; done += per) {
        size_t m = count - done < per ? count - done : per;
        size_t off = done * esz, bytes = m * esz;
        src[0] = (char *)x->mine + off;
        if (mine_odd) {
            pd_copy(scratch, src[0], bytes);
            src[0] = scratch;
        }
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            src[i] = scratch + (size_t)i * chunk;
            PD_CHECK_GOTO(pd_cma_read(c->shm, p, src[i], x->from[p] + off,
                                      bytes, c->op->name),
                          st, out);
        }
        char *res = x->res != NULL && !res_odd ? x->res + off : scratch;
        pd_shm_reduce(c, res, src, n, m, 1);
        if (res_odd) {
            pd_copy(x->res + off, scratch, bytes);
        }
        for (int i = 1; i < n; i++) {
            int p = (r + i) % n;
            if (x->to != NULL && x->to[p] != 0) {
                PD_CHECK_GOTO(pd_cma_write(c->shm, p, x->to[p] + off, res,
                                           bytes, c->op->name),
                              st, out);
            }
        }
    }
out:
    pd_shm_ptrs_free(src, stack);
    return st;
}
