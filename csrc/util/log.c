#include "log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pd_log_level threshold = PD_LOG_OFF;
static int notices = 1;
static char subsystems[256];

/* The environment is read once, so logging costs one comparison when off. */
static void
read_env(void)
{
    const char *v = getenv("PYDDP_DEBUG");
    if (v != NULL) {
        if (strcasecmp(v, "TRACE") == 0 || strcasecmp(v, "DETAIL") == 0) {
            threshold = PD_LOG_TRACE;
        }
        else if (strcasecmp(v, "INFO") == 0) {
            threshold = PD_LOG_INFO;
        }
        else if (strcasecmp(v, "WARN") == 0) {
            threshold = PD_LOG_WARN;
        }
        else if (strcasecmp(v, "OFF") == 0) {
            notices = 0;
        }
    }
    const char *s = getenv("PYDDP_DEBUG_SUBSYS");
    if (s != NULL) {
        snprintf(subsystems, sizeof(subsystems), ",%s,", s);
    }
}

int
pd_log_notices_enabled(void)
{
    pthread_once(&once, read_env);
    return notices;
}

int
pd_log_enabled(pd_log_level level, const char *subsys)
{
    pthread_once(&once, read_env);
    if (level > threshold || threshold == PD_LOG_OFF) {
        return 0;
    }
    if (subsystems[0] != '\0') {
        char key[64];
        snprintf(key, sizeof(key), ",%s,", subsys);
        return strstr(subsystems, key) != NULL;
    }
    return 1;
}

void
pd_log(pd_log_level level, const char *subsys, const char *fmt, ...)
{
    static const char *const names[] = {"OFF", "WARN", "INFO", "TRACE"};
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /* one write per line, so lines of concurrent threads do not interleave */
    char line[1200];
    int n = snprintf(line, sizeof(line), "pyddp %ld %s %s: %s\n", (long)getpid(),
                     names[level], subsys, msg);
    if (n > 0) {
        size_t len = (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1;
        ssize_t w = write(STDERR_FILENO, line, len);
        (void)w;
    }
}
