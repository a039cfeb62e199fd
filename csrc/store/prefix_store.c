/* PrefixStore: keys become "<prefix>/<key>" in an underlying store (torch's
 * PrefixStore), e.g. to give each process group its own namespace. */
#include <stdlib.h>
#include <string.h>

#include "store.h"

typedef struct prefix_store {
    pd_store base;
    pd_store *inner;
    int own_inner;
    char *prefix;   /* with the trailing "/" */
    size_t plen;
} prefix_store;

static prefix_store *
ps_of(pd_store *s)
{
    return (prefix_store *)s;
}

static char *
ps_key(prefix_store *p, const char *key)
{
    size_t n = strlen(key);
    char *k = malloc(p->plen + n + 1);
    if (k != NULL) {
        memcpy(k, p->prefix, p->plen);
        memcpy(k + p->plen, key, n + 1);
    } else {
        pd_error(PD_ENOMEM, "PrefixStore: out of memory");
    }
    return k;
}

static pd_status
ps_set(pd_store *s, const char *key, const void *val, size_t n)
{
    char *k = ps_key(ps_of(s), key);
    if (k == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->set(ps_of(s)->inner, k, val, n);
    free(k);
    return st;
}

static pd_status
ps_get(pd_store *s, const char *key, double timeout, uint8_t **val,
       size_t *n)
{
    char *k = ps_key(ps_of(s), key);
    if (k == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->get(ps_of(s)->inner, k, timeout, val,
                                            n);
    free(k);
    return st;
}

static pd_status
ps_add(pd_store *s, const char *key, int64_t delta, int64_t *out)
{
    char *k = ps_key(ps_of(s), key);
    if (k == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->add(ps_of(s)->inner, k, delta, out);
    free(k);
    return st;
}

static pd_status
ps_compare_set(pd_store *s, const char *key, const void *expected,
               size_t explen, const void *desired, size_t deslen,
               uint8_t **out, size_t *outlen)
{
    char *k = ps_key(ps_of(s), key);
    if (k == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->compare_set(
        ps_of(s)->inner, k, expected, explen, desired, deslen, out, outlen);
    free(k);
    return st;
}

static pd_status
ps_wait(pd_store *s, const char *const *keys, size_t n, double timeout)
{
    char **ks = pd_store_prefix_keys(ps_of(s)->prefix, ps_of(s)->plen, keys, n);
    if (ks == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->wait(ps_of(s)->inner,
                                             (const char *const *)ks, n,
                                             timeout);
    pd_store_free_keys(ks, n);
    return st;
}

static pd_status
ps_check(pd_store *s, const char *const *keys, size_t n, int *out)
{
    char **ks = pd_store_prefix_keys(ps_of(s)->prefix, ps_of(s)->plen, keys, n);
    if (ks == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->check(ps_of(s)->inner,
                                              (const char *const *)ks, n, out);
    pd_store_free_keys(ks, n);
    return st;
}

static pd_status
ps_delete_key(pd_store *s, const char *key, int *deleted)
{
    char *k = ps_key(ps_of(s), key);
    if (k == NULL) {
        return PD_ENOMEM;
    }
    pd_status st = ps_of(s)->inner->ops->delete_key(ps_of(s)->inner, k,
                                                   deleted);
    free(k);
    return st;
}

static pd_status
ps_num_keys(pd_store *s, int64_t *out)
{
    /* Like torch: the count of the whole underlying store. */
    return ps_of(s)->inner->ops->num_keys(ps_of(s)->inner, out);
}

static void
ps_destroy(pd_store *s)
{
    prefix_store *p = ps_of(s);
    if (p->own_inner) {
        pd_store_destroy(p->inner);
    }
    free(p->prefix);
    free(p);
}

static const pd_store_ops prefix_ops = {
    .name = "PrefixStore",
    .set = ps_set,
    .get = ps_get,
    .add = ps_add,
    .compare_set = ps_compare_set,
    .wait = ps_wait,
    .check = ps_check,
    .delete_key = ps_delete_key,
    .num_keys = ps_num_keys,
    .destroy = ps_destroy,
};

pd_status
pd_prefix_store_new(const char *prefix, pd_store *inner, int own_inner,
                    pd_store **out)
{
    *out = NULL;
    if (prefix == NULL || inner == NULL) {
        return pd_error(PD_EINVAL, "PrefixStore: NULL prefix or store");
    }
    prefix_store *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        return pd_error(PD_ENOMEM, "PrefixStore: out of memory");
    }
    p->plen = strlen(prefix) + 1;
    p->prefix = malloc(p->plen + 1);
    if (p->prefix == NULL) {
        free(p);
        return pd_error(PD_ENOMEM, "PrefixStore: out of memory");
    }
    memcpy(p->prefix, prefix, p->plen - 1);
    p->prefix[p->plen - 1] = '/';
    p->prefix[p->plen] = '\0';
    p->base.ops = &prefix_ops;
    p->inner = inner;
    p->own_inner = own_inner;
    pd_store_set_timeout(&p->base, pd_store_timeout(inner));
    *out = &p->base;
    return PD_OK;
}
