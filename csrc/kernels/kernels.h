/* Element types, reduction operators and the reduction / cast kernels.
 *
 * Plain loops over contiguous arrays that the compiler vectorises (-O3).
 * float16 / bfloat16 are never reduced in their own precision: collectives
 * widen them to float32 (pd_cast_to_f32), reduce there, and round once
 * (pd_cast_from_f32, round-to-nearest-even, NaN stays NaN).
 */
#ifndef PD_KERNELS_H
#define PD_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

typedef enum pd_dtype {
    PD_BOOL = 0,
    PD_INT8,
    PD_UINT8,
    PD_INT16,
    PD_UINT16,
    PD_INT32,
    PD_UINT32,
    PD_INT64,
    PD_UINT64,
    PD_FLOAT16,
    PD_BFLOAT16,
    PD_FLOAT32,
    PD_FLOAT64,
    PD_COMPLEX64,
    PD_COMPLEX128,
    PD_NDTYPES
} pd_dtype;

/* Same numbering as torch.distributed.ReduceOp's public enum order. */
typedef enum pd_redop {
    PD_SUM = 0,
    PD_AVG,
    PD_PRODUCT,
    PD_MIN,
    PD_MAX,
    PD_BAND,
    PD_BOR,
    PD_BXOR,
    PD_NREDOPS
} pd_redop;

size_t pd_dtype_size(pd_dtype dt);           /* bytes per element; 0 if invalid */
const char *pd_dtype_name(pd_dtype dt);      /* "float32", "bfloat16", ... */
const char *pd_redop_name(pd_redop op);      /* "SUM", "AVG", ... */

/* The type reductions run in: float32 for float16/bfloat16, else dt. */
pd_dtype pd_dtype_accum(pd_dtype dt);

/* PD_OK if op is defined for dt, else PD_ETYPE with a message such as
 * "ReduceOp.BAND is not supported for dtype float32" (bitwise ops on
 * float/complex, MIN/MAX on complex, AVG on bool). */
pd_status pd_redop_check(pd_dtype dt, pd_redop op);

/* dst[i] = dst[i] (op) src[i] for i < count, in place.
 * dt must not be float16/bfloat16 (use the float32 accumulator).  AVG reduces
 * like SUM; the division happens once in pd_reduce_avg_finish.  bool: SUM/MAX/
 * BOR = logical or, PRODUCT/MIN/BAND = logical and, BXOR = xor (values 0/1).
 * MIN/MAX propagate NaN like numpy.minimum/maximum.  Integer overflow wraps
 * (computed in unsigned arithmetic, no UB). */
void pd_reduce(pd_dtype dt, pd_redop op, void *dst, const void *src,
               size_t count);

/* dst[i] = a[i] (op) b[i]; dst may alias a or b.  Same rules as pd_reduce. */
void pd_reduce3(pd_dtype dt, pd_redop op, void *dst, const void *a,
                const void *b, size_t count);

/* buf[i] /= n: floats/complex divide, integers truncate toward zero
 * (like NCCL's integer average).  dt must not be float16/bfloat16. */
void pd_reduce_avg_finish(pd_dtype dt, void *buf, size_t count, int n);

/* Half-precision conversions.  src/dst may not overlap.  dt is PD_FLOAT16 or
 * PD_BFLOAT16; float -> half rounds to nearest even, overflow -> inf,
 * NaN -> quiet NaN. */
void pd_cast_to_f32(pd_dtype dt, float *dst, const void *src, size_t count);
void pd_cast_from_f32(pd_dtype dt, void *dst, const float *src, size_t count);

/* memcpy for collective outputs; stream: the whole output is far larger
 * than the caches, write around them (non-temporal stores). */
void pd_copy_out(void *dst, const void *src, size_t n, int stream);

/* memcpy for the data of collectives (no overlap).  glibc's memcpy moves
 * mid-sized blocks with `rep movsb`, which on AMD Zen runs 10-20 times
 * slower when the destination sits 1-63 bytes past the source modulo 4096
 * (a store to every line aliases the next loads): exactly a NumPy array
 * (mmap'd, 16 bytes past a page) filled from a page-aligned bank.  Those
 * copies take a vector loop instead. */
void pd_copy(void *dst, const void *src, size_t n);
/* memmove likewise: overlapping regions go to memmove, others to pd_copy. */
void pd_move(void *dst, const void *src, size_t n);
/* pd_copy_out where the regions do not overlap, else memmove (nothing
 * when they are the same). */
void pd_move_out(void *dst, const void *src, size_t n, int stream);

#endif
