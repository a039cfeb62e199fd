/* Status codes and the thread-local error message of the pyddp C core.
 *
 * Every core function returns a pd_status.  On failure it stores a precise,
 * human-readable message in a thread-local buffer (pd_error / pd_syserror) and
 * returns the code; callers pass it up unchanged with PD_CHECK / PD_CHECK_GOTO.
 * Only the Python binding turns (status, message) into an exception, in one
 * place (csrc/python/module.c: pd_py_set_error).
 */
#ifndef PD_UTIL_STATUS_H
#define PD_UTIL_STATUS_H

#include <stddef.h>

typedef enum pd_status {
    PD_OK = 0,
    PD_EINVAL,      /* bad argument value                 -> ValueError */
    PD_ETYPE,       /* wrong type / op invalid for dtype   -> TypeError */
    PD_ENOMEM,      /* allocation failed                   -> MemoryError */
    PD_ESYS,        /* a system call failed                -> DistError */
    PD_ETIMEOUT,    /* an operation ran past its deadline  -> DistBackendError */
    PD_ENETWORK,    /* peer dead, connect failed, port in use, connection lost -> DistNetworkError */
    PD_ESTORE,      /* store: key missing after timeout, protocol error -> DistStoreError */
    PD_EMISMATCH,   /* ranks called different collectives  -> DistError */
    PD_EBACKEND,    /* other backend failure                -> DistBackendError */
    PD_EAUTH,       /* authentication failed               -> DistNetworkError */
    PD_ECLOSED,     /* object closed / group aborted       -> DistError */
    PD_EINTR,       /* a wait gave up for a pending signal (binding raises it) */
    PD_NSTATUS
} pd_status;

#define PD_ERRMSG_MAX 1024

/* The message of the last error set on this thread ("" when none). */
const char *pd_errmsg(void);

/* Set this thread's message (printf-style) and return st. */
pd_status pd_error(pd_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Like pd_error, then appends ": <strerror(errno)>" (errno read on entry). */
pd_status pd_syserror(pd_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prepend context to the current message: "<context>: <old message>". */
void pd_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

const char *pd_status_name(pd_status st);

#define PD_CHECK(expr)                        \
    do {                                      \
        pd_status pd_st_ = (expr);            \
        if (pd_st_ != PD_OK) {                \
            return pd_st_;                    \
        }                                     \
    } while (0)

#define PD_CHECK_GOTO(expr, st, label)        \
    do {                                      \
        (st) = (expr);                        \
        if ((st) != PD_OK) {                  \
            goto label;                       \
        }                                     \
    } while (0)

/* Monotonic clock in seconds. */
double pd_now(void);

/* Copy the C string src into dst of cap > 0 bytes, cut to fit and always
 * terminated (snprintf(dst, cap, "%s", src) without the formatting, which
 * costs a hot path such as a small collective's flight record). */
void pd_strlcpy(char *dst, const char *src, size_t cap);

#endif
