#include "status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static _Thread_local char errbuf[PD_ERRMSG_MAX];

const char *
pd_errmsg(void)
{
    return errbuf;
}

pd_status
pd_error(pd_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
    va_end(ap);
    return st;
}

pd_status
pd_syserror(pd_status st, const char *fmt, ...)
{
    int err = errno;
    char ebuf[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
    va_end(ap);
    if (n < 0) {
        n = 0;
    }
    if ((size_t)n < sizeof(errbuf)) {
        const char *es = strerror_r(err, ebuf, sizeof(ebuf));
        snprintf(errbuf + n, sizeof(errbuf) - (size_t)n, ": %s", es);
    }
    return st;
}

void
pd_error_prefix(const char *fmt, ...)
{
    char old[PD_ERRMSG_MAX];
    memcpy(old, errbuf, sizeof(old));
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(errbuf, sizeof(errbuf), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(errbuf)) {
        /* Append ": <old>", cut to fit.  A plain copy rather than
         * snprintf("%s"), which -Wformat-truncation flags at -O1. */
        size_t at = (size_t)n;
        size_t olen = strnlen(old, sizeof(old) - 1);
        if (at + 2 < sizeof(errbuf)) {
            errbuf[at++] = ':';
            errbuf[at++] = ' ';
            size_t take = sizeof(errbuf) - 1 - at;
            if (olen < take) {
                take = olen;
            }
            memcpy(errbuf + at, old, take);
            at += take;
        }
        errbuf[at] = '\0';
    }
}

const char *
pd_status_name(pd_status st)
{
    static const char *const names[PD_NSTATUS] = {
        "ok", "invalid argument", "type error", "out of memory",
        "system error", "timeout", "network error", "store error",
        "collective mismatch", "backend error", "authentication failed",
        "closed", "interrupted",
    };
    if ((int)st < 0 || st >= PD_NSTATUS) {
        return "unknown status";
    }
    return names[st];
}

void
pd_strlcpy(char *dst, const char *src, size_t cap)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

double
pd_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
