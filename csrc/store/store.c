/* Generic store calls: argument checks, default timeouts, the standard
 * timeout message. */
#include "store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static pd_status
check_key(pd_store *s, const char *key)
{
    if (s == NULL) {
        return pd_error(PD_EINVAL, "store: NULL store");
    }
    if (key == NULL) {
        return pd_error(PD_EINVAL, "%s: NULL key", s->ops->name);
    }
    return PD_OK;
}

static double
resolve_timeout(pd_store *s, double timeout)
{
    if (timeout == PD_STORE_DEFAULT_TIMEOUT) {
        return pd_store_timeout(s);
    }
    return timeout > 0 ? timeout : 0.0;
}

pd_status
pd_store_set(pd_store *s, const char *key, const void *val, size_t n)
{
    PD_CHECK(check_key(s, key));
    if (val == NULL && n > 0) {
        return pd_error(PD_EINVAL, "%s.set: NULL value", s->ops->name);
    }
    if (n > PD_STORE_MAX_VALUE) {
        return pd_error(PD_EINVAL, "%s.set: value of %zu bytes for key '%s' "
                        "exceeds the limit of %zu bytes", s->ops->name, n, key,
                        PD_STORE_MAX_VALUE);
    }
    return s->ops->set(s, key, val, n);
}

pd_status
pd_store_append(pd_store *s, const char *key, const void *val, size_t n)
{
    PD_CHECK(check_key(s, key));
    if (val == NULL && n > 0) {
        return pd_error(PD_EINVAL, "%s.append: NULL value", s->ops->name);
    }
    if (n > PD_STORE_MAX_VALUE) {
        return pd_error(PD_EINVAL, "%s.append: value of %zu bytes for key "
                        "'%s' exceeds the limit of %zu bytes", s->ops->name, n,
                        key, PD_STORE_MAX_VALUE);
    }
    return s->ops->append(s, key, val, n);
}

pd_status
pd_store_list_keys(pd_store *s, char ***keys, size_t *n)
{
    if (s == NULL) {
        return pd_error(PD_EINVAL, "store: NULL store");
    }
    *keys = NULL;
    *n = 0;
    return s->ops->list_keys(s, keys, n);
}

pd_status
pd_store_get(pd_store *s, const char *key, uint8_t **val, size_t *n)
{
    return pd_store_get_timeout(s, key, PD_STORE_DEFAULT_TIMEOUT, val, n);
}

pd_status
pd_store_get_timeout(pd_store *s, const char *key, double timeout,
                     uint8_t **val, size_t *n)
{
    PD_CHECK(check_key(s, key));
    *val = NULL;
    *n = 0;
    return s->ops->get(s, key, resolve_timeout(s, timeout), val, n);
}

pd_status
pd_store_add(pd_store *s, const char *key, int64_t delta, int64_t *out)
{
    PD_CHECK(check_key(s, key));
    return s->ops->add(s, key, delta, out);
}

pd_status
pd_store_compare_set(pd_store *s, const char *key, const void *expected,
                     size_t expected_len, const void *desired,
                     size_t desired_len, uint8_t **out, size_t *out_len)
{
    PD_CHECK(check_key(s, key));
    if ((expected == NULL && expected_len > 0) ||
        (desired == NULL && desired_len > 0)) {
        return pd_error(PD_EINVAL, "%s.compare_set: NULL value", s->ops->name);
    }
    if (expected_len > PD_STORE_MAX_VALUE || desired_len > PD_STORE_MAX_VALUE) {
        return pd_error(PD_EINVAL, "%s.compare_set: value for key '%s' exceeds "
                        "the limit of %zu bytes", s->ops->name, key,
                        PD_STORE_MAX_VALUE);
    }
    *out = NULL;
    *out_len = 0;
    return s->ops->compare_set(s, key, expected, expected_len, desired,
                               desired_len, out, out_len);
}

static pd_status
check_keys(pd_store *s, const char *const *keys, size_t nkeys,
           const char *what)
{
    if (s == NULL) {
        return pd_error(PD_EINVAL, "store: NULL store");
    }
    if (nkeys > 0 && keys == NULL) {
        return pd_error(PD_EINVAL, "%s.%s: NULL key list", s->ops->name, what);
    }
    for (size_t i = 0; i < nkeys; i++) {
        if (keys[i] == NULL) {
            return pd_error(PD_EINVAL, "%s.%s: key %zu is NULL", s->ops->name,
                            what, i);
        }
    }
    return PD_OK;
}

pd_status
pd_store_wait(pd_store *s, const char *const *keys, size_t nkeys,
              double timeout)
{
    PD_CHECK(check_keys(s, keys, nkeys, "wait"));
    return s->ops->wait(s, keys, nkeys, resolve_timeout(s, timeout));
}

pd_status
pd_store_check(pd_store *s, const char *const *keys, size_t nkeys, int *out)
{
    PD_CHECK(check_keys(s, keys, nkeys, "check"));
    *out = 0;
    return s->ops->check(s, keys, nkeys, out);
}

pd_status
pd_store_delete_key(pd_store *s, const char *key, int *deleted)
{
    PD_CHECK(check_key(s, key));
    *deleted = 0;
    return s->ops->delete_key(s, key, deleted);
}

pd_status
pd_store_num_keys(pd_store *s, int64_t *out)
{
    if (s == NULL) {
        return pd_error(PD_EINVAL, "store: NULL store");
    }
    return s->ops->num_keys(s, out);
}

void
pd_store_set_timeout(pd_store *s, double timeout)
{
    atomic_store(&s->timeout, timeout > 0 ? timeout : 0.0);
}

double
pd_store_timeout(const pd_store *s)
{
    return atomic_load(&((pd_store *)s)->timeout);
}

void
pd_store_destroy(pd_store *s)
{
    if (s != NULL) {
        s->ops->destroy(s);
    }
}

pd_status
pd_store_timeout_error(const char *key_prefix, double timeout,
                       const char *const *keys, size_t nkeys)
{
    char msg[PD_ERRMSG_MAX];
    size_t off = 0;
    int n = snprintf(msg, sizeof(msg), "wait timeout after %lldms, keys: ",
                     (long long)(timeout * 1000.0 + 0.5));
    off = n > 0 ? (size_t)n : 0;
    for (size_t i = 0; i < nkeys && off < sizeof(msg); i++) {
        n = snprintf(msg + off, sizeof(msg) - off, "%s%s%s", i ? ", " : "",
                     key_prefix, keys[i]);
        if (n < 0) {
            break;
        }
        off += (size_t)n;
    }
    if (off >= sizeof(msg)) {
        /* Too many keys for one message: mark the cut. */
        memcpy(msg + sizeof(msg) - 6, ", ...", 6);
    }
    return pd_error(PD_ESTORE, "%s", msg);
}

char **
pd_store_prefix_keys(const char *prefix, size_t plen, const char *const *keys,
                     size_t n)
{
    char **ks = calloc(n ? n : 1, sizeof(*ks));
    if (ks == NULL) {
        pd_error(PD_ENOMEM, "store: out of memory");
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        size_t kl = strlen(keys[i]);
        ks[i] = malloc(plen + kl + 1);
        if (ks[i] == NULL) {
            pd_store_free_keys(ks, i);
            pd_error(PD_ENOMEM, "store: out of memory");
            return NULL;
        }
        memcpy(ks[i], prefix, plen);
        memcpy(ks[i] + plen, keys[i], kl + 1);
    }
    return ks;
}

void
pd_store_free_keys(char **ks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(ks[i]);
    }
    free(ks);
}
