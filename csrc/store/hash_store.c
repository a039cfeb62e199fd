/* HashStore: an in-memory store for threads of one process (torch's
 * HashStore).  One mutex guards the table; waiters sleep on a condition
 * variable (monotonic clock) that every write broadcasts. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/sync.h"
#include "kvmap.h"
#include "store.h"

typedef struct hash_store {
    pd_store base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pd_kvmap map;
    int mu_init;
    int cv_init;
} hash_store;

static hash_store *
hs_of(pd_store *s)
{
    return (hash_store *)s;
}

/* Sleep on the condvar until woken or deadline (0 = none).  Returns 1 when
 * the deadline passed. */
static int
hs_sleep(hash_store *h, double deadline)
{
    return pd_cond_wait_until(&h->cv, &h->mu, deadline);
}

static pd_status
hs_set(pd_store *s, const char *key, const void *val, size_t n)
{
    hash_store *h = hs_of(s);
    pd_kv_entry *e;
    pthread_mutex_lock(&h->mu);
    pd_status st = pd_kvmap_get_or_add(&h->map, key, strlen(key), &e);
    if (st == PD_OK) {
        st = pd_kvmap_store(&h->map, e, val, n);
        if (st != PD_OK && !e->present) {
            pd_kvmap_remove(&h->map, e);
        }
    }
    if (st == PD_OK) {
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static int
all_present(hash_store *h, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        pd_kv_entry *e = pd_kvmap_find(&h->map, keys[i], strlen(keys[i]));
        if (e == NULL || !e->present) {
            return 0;
        }
    }
    return 1;
}

static pd_status
hs_wait_locked(hash_store *h, const char *const *keys, size_t n,
               double timeout)
{
    double deadline = timeout > 0 ? pd_now() + timeout : 0;
    while (!all_present(h, keys, n)) {
        if (hs_sleep(h, deadline)) {
            return pd_store_timeout_error("", timeout, keys, n);
        }
    }
    return PD_OK;
}

static pd_status
hs_get(pd_store *s, const char *key, double timeout, uint8_t **val,
       size_t *n)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    pd_status st = hs_wait_locked(h, &key, 1, timeout);
    if (st == PD_OK) {
        pd_kv_entry *e = pd_kvmap_find(&h->map, key, strlen(key));
        st = pd_kv_dup(e->val, e->vallen, val);
        if (st == PD_OK) {
            *n = e->vallen;
        }
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static pd_status
hs_add(pd_store *s, const char *key, int64_t delta, int64_t *out)
{
    hash_store *h = hs_of(s);
    pd_kv_entry *changed = NULL;
    pthread_mutex_lock(&h->mu);
    pd_status st = pd_kv_add(&h->map, key, strlen(key), delta, out, &changed);
    if (changed != NULL) {
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static pd_status
hs_compare_set(pd_store *s, const char *key, const void *expected,
               size_t explen, const void *desired, size_t deslen,
               uint8_t **out, size_t *outlen)
{
    hash_store *h = hs_of(s);
    pd_kv_entry *changed = NULL;
    const uint8_t *res;
    size_t reslen;
    pthread_mutex_lock(&h->mu);
    pd_status st = pd_kv_compare_set(&h->map, key, strlen(key), expected,
                                     explen, desired, deslen, &res, &reslen,
                                     &changed);
    if (st == PD_OK) {
        st = pd_kv_dup(res, reslen, out);
        if (st == PD_OK) {
            *outlen = reslen;
        }
    }
    if (changed != NULL) {
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static pd_status
hs_wait(pd_store *s, const char *const *keys, size_t n, double timeout)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    pd_status st = hs_wait_locked(h, keys, n, timeout);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static pd_status
hs_check(pd_store *s, const char *const *keys, size_t n, int *out)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    *out = all_present(h, keys, n);
    pthread_mutex_unlock(&h->mu);
    return PD_OK;
}

static pd_status
hs_delete_key(pd_store *s, const char *key, int *deleted)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    pd_kv_entry *e = pd_kvmap_find(&h->map, key, strlen(key));
    *deleted = e != NULL ? pd_kvmap_unset(&h->map, e) : 0;
    pthread_mutex_unlock(&h->mu);
    return PD_OK;
}

static pd_status
hs_num_keys(pd_store *s, int64_t *out)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    *out = (int64_t)h->map.npresent;
    pthread_mutex_unlock(&h->mu);
    return PD_OK;
}

static pd_status
hs_append(pd_store *s, const char *key, const void *val, size_t n)
{
    hash_store *h = hs_of(s);
    pd_kv_entry *changed = NULL;
    pthread_mutex_lock(&h->mu);
    pd_status st = pd_kv_append(&h->map, key, strlen(key), val, n, &changed);
    if (changed != NULL) {
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static pd_status
hs_list_keys(pd_store *s, char ***keys, size_t *n)
{
    hash_store *h = hs_of(s);
    pthread_mutex_lock(&h->mu);
    pd_status st = pd_kvmap_list(&h->map, NULL, keys, n);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static void
hs_destroy(pd_store *s)
{
    hash_store *h = hs_of(s);
    pd_kvmap_free(&h->map);
    if (h->cv_init) {
        pthread_cond_destroy(&h->cv);
    }
    if (h->mu_init) {
        pthread_mutex_destroy(&h->mu);
    }
    free(h);
}

static const pd_store_ops hash_ops = {
    .name = "HashStore",
    .set = hs_set,
    .get = hs_get,
    .add = hs_add,
    .compare_set = hs_compare_set,
    .wait = hs_wait,
    .check = hs_check,
    .delete_key = hs_delete_key,
    .num_keys = hs_num_keys,
    .append = hs_append,
    .list_keys = hs_list_keys,
    .destroy = hs_destroy,
};

pd_status
pd_hash_store_new(double timeout, pd_store **out)
{
    pd_status st = PD_OK;
    hash_store *h = calloc(1, sizeof(*h));
    *out = NULL;
    if (h == NULL) {
        return pd_error(PD_ENOMEM, "HashStore: out of memory");
    }
    h->base.ops = &hash_ops;
    pd_store_set_timeout(&h->base, timeout);
    if (pthread_mutex_init(&h->mu, NULL) != 0) {
        st = pd_error(PD_ESYS, "HashStore: pthread_mutex_init failed");
        goto fail;
    }
    h->mu_init = 1;
    PD_CHECK_GOTO(pd_cond_init_monotonic(&h->cv, "HashStore"), st, fail);
    h->cv_init = 1;
    PD_CHECK_GOTO(pd_kvmap_init(&h->map), st, fail);
    *out = &h->base;
    return PD_OK;
fail:
    hs_destroy(&h->base);
    return st;
}
