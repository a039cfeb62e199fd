/* Logging by subsystem, off by default.
 *
 * PYDDP_DEBUG=WARN|INFO|TRACE (DETAIL = TRACE) turns it on (read once, here);
 * notices (PD_NOTICE) are on unless PYDDP_DEBUG=OFF;
 * PYDDP_DEBUG_SUBSYS=group,tcp,store limits it to some subsystems.
 * Lines go to stderr as "pyddp <pid> <LEVEL> <subsys>: <message>".
 */
#ifndef PD_UTIL_LOG_H
#define PD_UTIL_LOG_H

typedef enum pd_log_level {
    PD_LOG_OFF = 0,
    PD_LOG_WARN,
    PD_LOG_INFO,
    PD_LOG_TRACE
} pd_log_level;

int pd_log_enabled(pd_log_level level, const char *subsys);
/* Notices: what a long wait is waiting for, said at a bounded rate.  On by
 * default (a silent wait looks like a hang); PYDDP_DEBUG=OFF silences them. */
int pd_log_notices_enabled(void);
void pd_log(pd_log_level level, const char *subsys, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define PD_NOTICE(subsys, ...)                           \
    do {                                                 \
        if (pd_log_notices_enabled()) {                  \
            pd_log(PD_LOG_WARN, (subsys), __VA_ARGS__);  \
        }                                                \
    } while (0)

#define PD_LOG(level, subsys, ...)                 \
    do {                                           \
        if (pd_log_enabled((level), (subsys))) {   \
            pd_log((level), (subsys), __VA_ARGS__); \
        }                                          \
    } while (0)

#endif
