/* Copies for large collective outputs.
 *
 * A normal store to a line that is not in cache first reads it (read for
 * ownership), so copying S bytes into an array far larger than the caches
 * moves 3S bytes through memory.  The outputs of large collectives are not
 * read again soon, so past a threshold they are written with non-temporal
 * (streaming) stores: 2S, which matters when memory bandwidth is the limit
 * (both ranks of a 2-core host copying at once).
 */
#include <stdint.h>
#include <string.h>

#include "kernels.h"

#if defined(__x86_64__)
#include <emmintrin.h>

/* 64 bytes a step through unaligned vector loads (SSE2: every x86-64),
 * stored with streaming stores (dst 16-byte aligned) or plain ones. */
static void
copy_loop(char *dst, const char *src, size_t n, int stream)
{
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        if (stream) {
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        else {
            _mm_storeu_si128((__m128i *)(dst + i), a);
            _mm_storeu_si128((__m128i *)(dst + i + 16), b);
            _mm_storeu_si128((__m128i *)(dst + i + 32), c);
            _mm_storeu_si128((__m128i *)(dst + i + 48), d);
        }
    }
    if (stream) {
        _mm_sfence();
    }
    memcpy(dst + i, src + i, n - i);
}

static void
copy_stream(char *dst, const char *src, size_t n)
{
    /* head up to 16-byte alignment of dst */
    size_t head = (size_t)(-(uintptr_t)dst & 15);
    if (head > n) {
        head = n;
    }
    memcpy(dst, src, head);
    copy_loop(dst + head, src + head, n - head, 1);
}
#endif


/* Below this glibc copies with vector loops, which alias harmlessly. */
#define ALIAS_MIN ((size_t)2048)

void
pd_copy(void *dst, const void *src, size_t n)
{
#if defined(__x86_64__)
    size_t gap = ((uintptr_t)dst - (uintptr_t)src) & 4095;
    if (n >= ALIAS_MIN && gap != 0 && gap < 64) {
        copy_loop(dst, src, n, 0);
        return;
    }
#endif
    memcpy(dst, src, n);
}

void
pd_move(void *dst, const void *src, size_t n)
{
    pd_move_out(dst, src, n, 0);
}

void
pd_move_out(void *dst, const void *src, size_t n, int stream)
{
    uintptr_t d = (uintptr_t)dst, s = (uintptr_t)src;
    if (n == 0) {
        return;
    }
    if (d < s + n && s < d + n) {
        if (d != s) {
            memmove(dst, src, n);
        }
        return;
    }
    pd_copy_out(dst, src, n, stream);
}

void
pd_copy_out(void *dst, const void *src, size_t n, int stream)
{
#if defined(__x86_64__)
    if (stream && n >= 4096) {
        copy_stream(dst, src, n);
        return;
    }
#endif
    (void)stream;
    pd_copy(dst, src, n);
}
