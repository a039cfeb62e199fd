/* A minimal test harness for tests/c: checks count failures and report the
 * location; main returns pd_test_result(). */
#ifndef PD_TEST_H
#define PD_TEST_H

#include <stdio.h>
#include <string.h>

#include "util/status.h"

static int pd_test_failures;

#define T_CHECK(cond)                                                        \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, \
                    #cond);                                                  \
            pd_test_failures++;                                              \
        }                                                                    \
    } while (0)

/* expr must return want (a pd_status). */
#define T_ST(expr, want)                                                     \
    do {                                                                     \
        pd_status t_st_ = (expr);                                            \
        if (t_st_ != (want)) {                                               \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s; message: "  \
                    "%s\n", __FILE__, __LINE__, #expr,                       \
                    pd_status_name(t_st_), pd_status_name(want),             \
                    pd_errmsg());                                            \
            pd_test_failures++;                                              \
        }                                                                    \
    } while (0)

#define T_OK(expr) T_ST(expr, PD_OK)

/* The current error message contains s. */
#define T_MSG_HAS(s)                                                         \
    do {                                                                     \
        if (strstr(pd_errmsg(), (s)) == NULL) {                              \
            fprintf(stderr, "%s:%d: message \"%s\" lacks \"%s\"\n",          \
                    __FILE__, __LINE__, pd_errmsg(), (s));                   \
            pd_test_failures++;                                              \
        }                                                                    \
    } while (0)

#define T_RUN(fn)                                                            \
    do {                                                                     \
        int t_before_ = pd_test_failures;                                    \
        fn();                                                                \
        printf("  %-40s %s\n", #fn,                                          \
               pd_test_failures == t_before_ ? "ok" : "FAILED");             \
        fflush(stdout);                                                      \
    } while (0)

static inline int
pd_test_result(void)
{
    if (pd_test_failures) {
        fprintf(stderr, "%d check(s) failed\n", pd_test_failures);
        return 1;
    }
    return 0;
}

#endif
