/* The ABI facts pyddp assumes (csrc/cuda/cudawrap.h, written without the headers), checked against the
 * real nccl.h and cuda_runtime_api.h.  Built and run by tests/gpu/abi_facts.py: one line per fact,
 * "ok" or "MISMATCH", and exit status 1 on any mismatch. */
#include <stddef.h>
#include <stdio.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "cudawrap.h"

static int bad;

static void
fact(const char *what, long long mine, long long real)
{
    printf("%-44s pyddp %-12lld header %-12lld %s\n", what, mine, real, mine == real ? "ok" : "MISMATCH");
    bad |= mine != real;
}

#define SAME(what, mine, real) fact(what, (long long)(mine), (long long)(real))
#define OFF(field_p, field_r) \
    SAME("ncclConfig_t." #field_r " offset", offsetof(pd_nccl_config, field_p), offsetof(ncclConfig_t, field_r))

int
main(void)
{
    printf("nccl.h %d.%d.%d (NCCL_VERSION_CODE %d), CUDART_VERSION %d\n", NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
           NCCL_VERSION_CODE, CUDART_VERSION);
    /* NCCL */
    SAME("sizeof(ncclUniqueId)", sizeof(pd_nccl_uid), sizeof(ncclUniqueId));
    SAME("ncclSuccess", PD_NCCL_SUCCESS, ncclSuccess);
    SAME("ncclUnhandledCudaError", PD_NCCL_UNHANDLED_CUDA, ncclUnhandledCudaError);
    SAME("ncclSystemError", PD_NCCL_SYSTEM, ncclSystemError);
    SAME("ncclInternalError", PD_NCCL_INTERNAL, ncclInternalError);
    SAME("ncclInvalidArgument", PD_NCCL_INVALID_ARGUMENT, ncclInvalidArgument);
    SAME("ncclInvalidUsage", PD_NCCL_INVALID_USAGE, ncclInvalidUsage);
    SAME("ncclRemoteError", PD_NCCL_REMOTE, ncclRemoteError);
    SAME("ncclInProgress", PD_NCCL_IN_PROGRESS, ncclInProgress);
    /* ncclTimeout (8) came after 2.28; before it ncclNumResults is 8, so 8 is never another result */
    if ((int)ncclNumResults > PD_NCCL_TIMEOUT) {
        SAME("ncclTimeout (the last result before ncclNumResults)", PD_NCCL_TIMEOUT, (int)ncclNumResults - 1);
    }
    else {
        printf("%-44s not in this nccl.h (ncclNumResults %d)\n", "ncclTimeout", (int)ncclNumResults);
    }
    SAME("ncclInt8", PD_NCCL_INT8, ncclInt8);
    SAME("ncclUint8", PD_NCCL_UINT8, ncclUint8);
    SAME("ncclInt32", PD_NCCL_INT32, ncclInt32);
    SAME("ncclUint32", PD_NCCL_UINT32, ncclUint32);
    SAME("ncclInt64", PD_NCCL_INT64, ncclInt64);
    SAME("ncclUint64", PD_NCCL_UINT64, ncclUint64);
    SAME("ncclFloat16", PD_NCCL_FLOAT16, ncclFloat16);
    SAME("ncclFloat32", PD_NCCL_FLOAT32, ncclFloat32);
    SAME("ncclFloat64", PD_NCCL_FLOAT64, ncclFloat64);
    SAME("ncclBfloat16", PD_NCCL_BFLOAT16, ncclBfloat16);
    SAME("ncclSum", PD_NCCL_SUM, ncclSum);
    SAME("ncclProd", PD_NCCL_PROD, ncclProd);
    SAME("ncclMax", PD_NCCL_MAX, ncclMax);
    SAME("ncclMin", PD_NCCL_MIN, ncclMin);
    SAME("ncclAvg", PD_NCCL_AVG, ncclAvg);
    SAME("NCCL_SPLIT_NOCOLOR", PD_NCCL_SPLIT_NOCOLOR, NCCL_SPLIT_NOCOLOR);
    SAME("NCCL_CONFIG_UNDEF_INT", PD_NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT);
    {
        ncclConfig_t real = NCCL_CONFIG_INITIALIZER;
        pd_nccl_config mine;
        pd_nccl_config_init(&mine, 0);
        SAME("NCCL_CONFIG_INITIALIZER.magic", mine.magic, real.magic);
        SAME("sizeof(pyddp config) <= sizeof(ncclConfig_t)", 1, sizeof(mine) <= sizeof(real));
    }
    OFF(size, size);
    OFF(magic, magic);
    OFF(version, version);
    OFF(blocking, blocking);
    OFF(cga_cluster_size, cgaClusterSize);
    OFF(min_ctas, minCTAs);
    OFF(max_ctas, maxCTAs);
    OFF(net_name, netName);
    OFF(split_share, splitShare);
    /* CUDA runtime */
    SAME("cudaSuccess", PD_CUDA_SUCCESS, cudaSuccess);
    SAME("cudaErrorInvalidValue", PD_CUDA_ERR_INVALID_VALUE, cudaErrorInvalidValue);
    SAME("cudaErrorInitializationError", PD_CUDA_ERR_INITIALIZATION, cudaErrorInitializationError);
    SAME("cudaErrorInvalidDevice", PD_CUDA_ERR_INVALID_DEVICE, cudaErrorInvalidDevice);
    SAME("cudaErrorInsufficientDriver", PD_CUDA_ERR_INSUFFICIENT_DRIVER, cudaErrorInsufficientDriver);
    SAME("cudaErrorNoDevice", PD_CUDA_ERR_NO_DEVICE, cudaErrorNoDevice);
    SAME("cudaErrorNotReady", PD_CUDA_ERR_NOT_READY, cudaErrorNotReady);
    SAME("cudaStreamLegacy", (size_t)PD_CUDA_STREAM_LEGACY, (size_t)cudaStreamLegacy);
    SAME("cudaStreamPerThread", (size_t)PD_CUDA_STREAM_PER_THREAD, (size_t)cudaStreamPerThread);
    SAME("cudaStreamNonBlocking", PD_CUDA_STREAM_NON_BLOCKING, cudaStreamNonBlocking);
    SAME("cudaEventDisableTiming", PD_CUDA_EVENT_DISABLE_TIMING, cudaEventDisableTiming);
    SAME("cudaHostAllocPortable", PD_CUDA_HOST_ALLOC_PORTABLE, cudaHostAllocPortable);
    SAME("cudaMemcpyHostToHost", PD_CUDA_H2H, cudaMemcpyHostToHost);
    SAME("cudaMemcpyHostToDevice", PD_CUDA_H2D, cudaMemcpyHostToDevice);
    SAME("cudaMemcpyDeviceToHost", PD_CUDA_D2H, cudaMemcpyDeviceToHost);
    SAME("cudaMemcpyDeviceToDevice", PD_CUDA_D2D, cudaMemcpyDeviceToDevice);
    SAME("cudaMemcpyDefault", PD_CUDA_DEFAULT, cudaMemcpyDefault);
    SAME("cudaMemoryTypeUnregistered", PD_CUDA_MEM_UNREGISTERED, cudaMemoryTypeUnregistered);
    SAME("cudaMemoryTypeHost", PD_CUDA_MEM_HOST, cudaMemoryTypeHost);
    SAME("cudaMemoryTypeDevice", PD_CUDA_MEM_DEVICE, cudaMemoryTypeDevice);
    SAME("cudaMemoryTypeManaged", PD_CUDA_MEM_MANAGED, cudaMemoryTypeManaged);
    SAME("sizeof(cudaPointerAttributes)", sizeof(pd_cuda_ptr_attrs), sizeof(struct cudaPointerAttributes));
    SAME("cudaPointerAttributes.type offset", offsetof(pd_cuda_ptr_attrs, type),
         offsetof(struct cudaPointerAttributes, type));
    SAME("cudaPointerAttributes.device offset", offsetof(pd_cuda_ptr_attrs, device),
         offsetof(struct cudaPointerAttributes, device));
    SAME("cudaPointerAttributes.devicePointer offset", offsetof(pd_cuda_ptr_attrs, device_pointer),
         offsetof(struct cudaPointerAttributes, devicePointer));
    SAME("cudaPointerAttributes.hostPointer offset", offsetof(pd_cuda_ptr_attrs, host_pointer),
         offsetof(struct cudaPointerAttributes, hostPointer));
    printf("%s\n", bad ? "ABI: MISMATCH (see above)" : "ABI: every fact pyddp assumes matches the headers");
    return bad;
}
