/* A test-only stand-in for libcudart and libnccl (tests/fakecuda): "device"
 * memory is host memory, every stream is a worker thread running its FIFO of
 * tasks, and NCCL calls run on those streams across processes through POSIX
 * shared memory.  Built by tests/fakecuda/__init__.py; never a fallback for
 * users.  This header is what fake_nccl.c uses of fake_cudart.c (libnccl.so.2
 * links against libcudart.so.13, so a process has one set of streams). */
#ifndef FAKECUDA_H
#define FAKECUDA_H

#include <stddef.h>

typedef int cudaError_t;
typedef void *cudaStream_t;

enum {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInitializationError = 3,
    cudaErrorInvalidMemcpyDirection = 21,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidDevice = 101,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
};

#define FAKECUDA_EXPORT __attribute__((visibility("default")))

typedef struct { /* cudaPointerAttributes */
    int type;
    int device;
    void *devicePointer;
    void *hostPointer;
    long reserved[8];
} cudaPointerAttributes;

cudaError_t cudaGetDevice(int *device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes *a, const void *p);
const char *cudaGetErrorString(cudaError_t e);

/* Append a task to stream `s` (0, 0x1, 0x2 or a created stream): run(arg) is
 * called on the stream's worker thread after everything queued before it. */
FAKECUDA_EXPORT cudaError_t fakecuda_enqueue(cudaStream_t s, void (*run)(void *), void *arg);

/* Whether [p, p + n) lies inside one live cudaMalloc or cudaHostAlloc block;
 * *device receives its device. */
FAKECUDA_EXPORT int fakecuda_accessible(const void *p, size_t n, int *device);

/* Where the bytes at p are for this library's own copies and kernels: the
 * shadow of a device address (the address itself is PROT_NONE), else p. */
FAKECUDA_EXPORT void *fakecuda_host(const void *p);

/* An illegal memory access by a task: the process's sticky error becomes
 * cudaErrorIllegalAddress and the message goes to stderr. */
FAKECUDA_EXPORT void fakecuda_fault(const char *what, const void *p, size_t n);

#endif /* FAKECUDA_H */
