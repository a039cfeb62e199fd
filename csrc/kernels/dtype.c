/* Names, sizes and the (dtype, op) validity rules shared by every kernel. */
#include "kernels.h"

static const size_t dtype_sizes[PD_NDTYPES] = {
    [PD_BOOL] = 1,      [PD_INT8] = 1,      [PD_UINT8] = 1,
    [PD_INT16] = 2,     [PD_UINT16] = 2,    [PD_INT32] = 4,
    [PD_UINT32] = 4,    [PD_INT64] = 8,     [PD_UINT64] = 8,
    [PD_FLOAT16] = 2,   [PD_BFLOAT16] = 2,  [PD_FLOAT32] = 4,
    [PD_FLOAT64] = 8,   [PD_COMPLEX64] = 8, [PD_COMPLEX128] = 16,
};

/* numpy / torch spellings, so messages read like the user's own code. */
static const char *const dtype_names[PD_NDTYPES] = {
    [PD_BOOL] = "bool",           [PD_INT8] = "int8",
    [PD_UINT8] = "uint8",         [PD_INT16] = "int16",
    [PD_UINT16] = "uint16",       [PD_INT32] = "int32",
    [PD_UINT32] = "uint32",       [PD_INT64] = "int64",
    [PD_UINT64] = "uint64",       [PD_FLOAT16] = "float16",
    [PD_BFLOAT16] = "bfloat16",   [PD_FLOAT32] = "float32",
    [PD_FLOAT64] = "float64",     [PD_COMPLEX64] = "complex64",
    [PD_COMPLEX128] = "complex128",
};

static const char *const redop_names[PD_NREDOPS] = {
    [PD_SUM] = "SUM",   [PD_AVG] = "AVG", [PD_PRODUCT] = "PRODUCT",
    [PD_MIN] = "MIN",   [PD_MAX] = "MAX", [PD_BAND] = "BAND",
    [PD_BOR] = "BOR",   [PD_BXOR] = "BXOR",
};

/* An enum may hold any int; compare as unsigned to reject negatives too. */
static int
dtype_valid(pd_dtype dt)
{
    return (unsigned)dt < (unsigned)PD_NDTYPES;
}

static int
redop_valid(pd_redop op)
{
    return (unsigned)op < (unsigned)PD_NREDOPS;
}

size_t
pd_dtype_size(pd_dtype dt)
{
    return dtype_valid(dt) ? dtype_sizes[dt] : 0;
}

const char *
pd_dtype_name(pd_dtype dt)
{
    return dtype_valid(dt) ? dtype_names[dt] : "invalid dtype";
}

const char *
pd_redop_name(pd_redop op)
{
    return redop_valid(op) ? redop_names[op] : "invalid op";
}

pd_dtype
pd_dtype_accum(pd_dtype dt)
{
    if (dt == PD_FLOAT16 || dt == PD_BFLOAT16) {
        return PD_FLOAT32;
    }
    return dt;
}

pd_status
pd_redop_check(pd_dtype dt, pd_redop op)
{
    if (!dtype_valid(dt)) {
        return pd_error(PD_EINVAL, "invalid dtype code %d", (int)dt);
    }
    if (!redop_valid(op)) {
        return pd_error(PD_EINVAL, "invalid ReduceOp code %d", (int)op);
    }
    int is_bool = dt == PD_BOOL;
    int is_int = dt >= PD_INT8 && dt <= PD_UINT64;
    int is_complex = dt == PD_COMPLEX64 || dt == PD_COMPLEX128;
    int ok;
    switch (op) {
    case PD_BAND:
    case PD_BOR:
    case PD_BXOR:
        ok = is_bool || is_int;
        break;
    case PD_MIN:
    case PD_MAX:
        /* complex numbers have no order (torch refuses them too) */
        ok = !is_complex;
        break;
    case PD_AVG:
        /* the mean of booleans is not a boolean */
        ok = !is_bool;
        break;
    default:
        ok = 1;
        break;
    }
    if (!ok) {
        return pd_error(PD_ETYPE, "ReduceOp.%s is not supported for dtype %s",
                        redop_names[op], dtype_names[dt]);
    }
    return PD_OK;
}
