/* A minimal test harness for tests/c: checks count failures and report the
 * location; main returns pd_test_result(). */
#ifndef PD_TEST_H
#define PD_TEST_H

#include <stdio.h>
#include <stdlib.h>
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

/* Runs fn and prints ok or FAILED.  PD_TEST_ONLY=name[,name...] runs only
 * those tests, PD_TEST_REPEAT=n runs each n times (a flaky one, under load
 * or a sanitizer, until it fails). */
#define T_RUN(fn)                                                            \
    do {                                                                     \
        if (!pd_test_selected(#fn)) {                                        \
            break;                                                           \
        }                                                                    \
        for (int t_i_ = 0; t_i_ < pd_test_repeat(); t_i_++) {                \
            int t_before_ = pd_test_failures;                                \
            fn();                                                            \
            printf("  %-40s %s\n", #fn,                                      \
                   pd_test_failures == t_before_ ? "ok" : "FAILED");         \
            fflush(stdout);                                                  \
        }                                                                    \
    } while (0)

static inline int
pd_test_selected(const char *name)
{
    const char *only = getenv("PD_TEST_ONLY");
    if (only == NULL || *only == '\0') {
        return 1;
    }
    size_t len = strlen(name);
    for (const char *p = only; *p != '\0';) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) {
            return 1;
        }
        p += n + (end != NULL);
    }
    return 0;
}

static inline int
pd_test_repeat(void)
{
    const char *s = getenv("PD_TEST_REPEAT");
    int n = s != NULL ? atoi(s) : 1;
    return n > 0 ? n : 1;
}

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
