/* Byte rings between two local ranks (shm.h): the ring from r to d lives
 * in r's segment; r alone advances its head, d alone its tail, and each
 * side checks the other's counter so a corrupt peer cannot send a copy
 * out of the ring.
 */
#include "internal.h"

#include "../../kernels/kernels.h"

size_t
pd_shm_ring_write(pd_shm *s, int d, const void *buf, size_t len)
{
    ring_ctl *mine = rctl(s, s->rank, d);
    uint64_t head = atomic_load_explicit(&mine->head, memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rctl(s, d, s->rank)->tail,
                                         memory_order_acquire);
    /* tail is the peer's word: a value behind or past what was written
     * (a corrupt or hostile peer) must not send the copy out of the ring */
    uint64_t used = head - tail;
    size_t space = used <= PD_SHM_RING_BYTES
                       ? PD_SHM_RING_BYTES - (size_t)used : 0;
    size_t n = len < space ? len : space;
    if (n == 0) {
        return 0;
    }
    char *rb = ring(s, s->rank, d);
    size_t at = (size_t)(head % PD_SHM_RING_BYTES);
    size_t first = PD_SHM_RING_BYTES - at < n ? PD_SHM_RING_BYTES - at : n;
    pd_copy(rb + at, buf, first);
    pd_copy(rb, (const char *)buf + first, n - first);
    atomic_store_explicit(&mine->head, head + n, memory_order_seq_cst);
    return n;
}

size_t
pd_shm_ring_read(pd_shm *s, int p, void *buf, size_t len)
{
    ring_ctl *mine = rctl(s, s->rank, p);
    uint64_t tail = atomic_load_explicit(&mine->tail, memory_order_relaxed);
    uint64_t head = atomic_load_explicit(&rctl(s, p, s->rank)->head,
                                         memory_order_acquire);
    /* head is the peer's word: never read more than one ring's worth */
    uint64_t used = head - tail;
    size_t avail = used <= PD_SHM_RING_BYTES ? (size_t)used
                                             : PD_SHM_RING_BYTES;
    size_t n = len < avail ? len : avail;
    if (n == 0) {
        return 0;
    }
    const char *rb = ring(s, p, s->rank);
    size_t at = (size_t)(tail % PD_SHM_RING_BYTES);
    size_t first = PD_SHM_RING_BYTES - at < n ? PD_SHM_RING_BYTES - at : n;
    pd_copy(buf, rb + at, first);
    pd_copy((char *)buf + first, rb, n - first);
    atomic_store_explicit(&mine->tail, tail + n, memory_order_seq_cst);
    return n;
}

int
pd_shm_ring_readable(pd_shm *s, int p)
{
    uint64_t tail = atomic_load_explicit(&rctl(s, s->rank, p)->tail,
                                         memory_order_relaxed);
    return atomic_load_explicit(&rctl(s, p, s->rank)->head,
                                memory_order_seq_cst) != tail;
}

int
pd_shm_ring_writable(pd_shm *s, int d)
{
    uint64_t head = atomic_load_explicit(&rctl(s, s->rank, d)->head,
                                         memory_order_relaxed);
    uint64_t tail = atomic_load_explicit(&rctl(s, d, s->rank)->tail,
                                         memory_order_seq_cst);
    return head - tail < PD_SHM_RING_BYTES;
}

void
pd_shm_ring_want(pd_shm *s, int p, int data, int space)
{
    ring_ctl *mine = rctl(s, s->rank, p);
    if (atomic_load_explicit(&mine->want_data, memory_order_relaxed) !=
        (uint32_t)data) {
        atomic_store_explicit(&mine->want_data, (uint32_t)data,
                              memory_order_seq_cst);
    }
    if (atomic_load_explicit(&mine->want_space, memory_order_relaxed) !=
        (uint32_t)space) {
        atomic_store_explicit(&mine->want_space, (uint32_t)space,
                              memory_order_seq_cst);
    }
    atomic_thread_fence(memory_order_seq_cst);
}

int
pd_shm_ring_peer_waits(pd_shm *s, int p, int data)
{
    ring_ctl *theirs = rctl(s, p, s->rank);
    return data ? atomic_load_explicit(&theirs->want_data,
                                       memory_order_seq_cst) != 0
                : atomic_load_explicit(&theirs->want_space,
                                       memory_order_seq_cst) != 0;
}
