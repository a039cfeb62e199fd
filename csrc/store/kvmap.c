#include "kvmap.h"
#include "store.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KV_INITIAL_BUCKETS 64

static uint64_t
kv_hash(const char *key, size_t n)
{
    /* FNV-1a: peers are authenticated, so no need for a keyed hash. */
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)key[i];
        h *= 1099511628211ull;
    }
    return h;
}

pd_status
pd_kvmap_init(pd_kvmap *m)
{
    memset(m, 0, sizeof(*m));
    m->buckets = calloc(KV_INITIAL_BUCKETS, sizeof(*m->buckets));
    if (m->buckets == NULL) {
        return pd_error(PD_ENOMEM, "store: out of memory for the key table");
    }
    m->nbuckets = KV_INITIAL_BUCKETS;
    return PD_OK;
}

void
pd_kvmap_free(pd_kvmap *m)
{
    if (m->buckets != NULL) {
        for (size_t i = 0; i < m->nbuckets; i++) {
            pd_kv_entry *e = m->buckets[i];
            while (e != NULL) {
                pd_kv_entry *next = e->next;
                free(e->val);
                free(e);
                e = next;
            }
        }
        free(m->buckets);
    }
    memset(m, 0, sizeof(*m));
}

pd_kv_entry *
pd_kvmap_find(const pd_kvmap *m, const char *key, size_t keylen)
{
    uint64_t h = kv_hash(key, keylen);
    for (pd_kv_entry *e = m->buckets[h & (m->nbuckets - 1)]; e != NULL;
         e = e->next) {
        if (e->hash == h && e->keylen == keylen &&
            memcmp(e->key, key, keylen) == 0) {
            return e;
        }
    }
    return NULL;
}

static void
kv_grow(pd_kvmap *m)
{
    size_t nb = m->nbuckets * 2;
    pd_kv_entry **b = calloc(nb, sizeof(*b));
    if (b == NULL) {
        return; /* Longer chains, still correct. */
    }
    for (size_t i = 0; i < m->nbuckets; i++) {
        pd_kv_entry *e = m->buckets[i];
        while (e != NULL) {
            pd_kv_entry *next = e->next;
            size_t j = e->hash & (nb - 1);
            e->next = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(m->buckets);
    m->buckets = b;
    m->nbuckets = nb;
}

pd_status
pd_kvmap_get_or_add(pd_kvmap *m, const char *key, size_t keylen,
                    pd_kv_entry **out)
{
    pd_kv_entry *e = pd_kvmap_find(m, key, keylen);
    if (e != NULL) {
        *out = e;
        return PD_OK;
    }
    e = calloc(1, sizeof(*e) + keylen + 1);
    if (e == NULL) {
        return pd_error(PD_ENOMEM, "store: out of memory for key of %zu bytes",
                        keylen);
    }
    e->hash = kv_hash(key, keylen);
    e->keylen = keylen;
    memcpy(e->key, key, keylen);
    e->key[keylen] = '\0';
    if (m->nentries + 1 > m->nbuckets) {
        kv_grow(m);
    }
    size_t j = e->hash & (m->nbuckets - 1);
    e->next = m->buckets[j];
    m->buckets[j] = e;
    m->nentries++;
    *out = e;
    return PD_OK;
}

pd_status
pd_kv_dup(const void *p, size_t n, uint8_t **out)
{
    uint8_t *v = malloc(n + 1);
    if (v == NULL) {
        return pd_error(PD_ENOMEM, "store: out of memory for a value of %zu "
                        "bytes", n);
    }
    if (n > 0) {
        memcpy(v, p, n);
    }
    v[n] = 0;
    *out = v;
    return PD_OK;
}

pd_status
pd_kvmap_store(pd_kvmap *m, pd_kv_entry *e, const void *val, size_t n)
{
    uint8_t *v = NULL;
    PD_CHECK(pd_kv_dup(val, n, &v));
    free(e->val);
    e->val = v;
    e->vallen = n;
    if (!e->present) {
        e->present = 1;
        m->npresent++;
    }
    return PD_OK;
}

void
pd_kvmap_remove(pd_kvmap *m, pd_kv_entry *e)
{
    pd_kv_entry **pp = &m->buckets[e->hash & (m->nbuckets - 1)];
    while (*pp != NULL && *pp != e) {
        pp = &(*pp)->next;
    }
    if (*pp == e) {
        *pp = e->next;
        m->nentries--;
        if (e->present) {
            m->npresent--;
        }
    }
    free(e->val);
    free(e);
}

int
pd_kvmap_unset(pd_kvmap *m, pd_kv_entry *e)
{
    int was = e->present;
    if (e->aux == NULL) {
        pd_kvmap_remove(m, e);
        return was;
    }
    if (was) {
        m->npresent--;
    }
    free(e->val);
    e->val = NULL;
    e->vallen = 0;
    e->present = 0;
    return was;
}

static int
is_space(uint8_t c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' ||
           c == '\f';
}

pd_status
pd_kv_parse_int(const char *key, const uint8_t *v, size_t n, int64_t *out)
{
    size_t i = 0;
    int neg = 0;
    uint64_t acc = 0;
    size_t digits = 0;

    while (i < n && is_space(v[i])) {
        i++;
    }
    if (i < n && (v[i] == '+' || v[i] == '-')) {
        neg = v[i] == '-';
        i++;
    }
    while (i < n && v[i] >= '0' && v[i] <= '9') {
        uint64_t d = (uint64_t)(v[i] - '0');
        uint64_t lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
        if (acc > (lim - d) / 10u) {
            return pd_error(PD_EINVAL, "add: the value of key '%s' does not fit "
                            "in int64", key);
        }
        acc = acc * 10u + d;
        digits++;
        i++;
    }
    while (i < n && is_space(v[i])) {
        i++;
    }
    if (digits == 0 || i != n) {
        char shown[48];
        size_t k = n < 40 ? n : 40;
        for (size_t j = 0; j < k; j++) {
            shown[j] = (v[j] >= 32 && v[j] < 127) ? (char)v[j] : '?';
        }
        shown[k] = '\0';
        return pd_error(PD_EINVAL, "add: the value of key '%s' is not an "
                        "integer: '%s'%s", key, shown, n > k ? "..." : "");
    }
    if (neg) {
        *out = acc == (uint64_t)INT64_MAX + 1u ? INT64_MIN : -(int64_t)acc;
    } else {
        *out = (int64_t)acc;
    }
    return PD_OK;
}

size_t
pd_kv_format_int(int64_t v, char *buf)
{
    int n = snprintf(buf, 24, "%" PRId64, v);
    return n > 0 ? (size_t)n : 0;
}

pd_status
pd_kv_add(pd_kvmap *m, const char *key, size_t keylen, int64_t delta,
          int64_t *out, pd_kv_entry **changed)
{
    int64_t cur = 0;
    pd_kv_entry *e = pd_kvmap_find(m, key, keylen);
    *changed = NULL;
    if (e != NULL && e->present) {
        PD_CHECK(pd_kv_parse_int(key, e->val, e->vallen, &cur));
    }
    if ((delta > 0 && cur > INT64_MAX - delta) ||
        (delta < 0 && cur < INT64_MIN - delta)) {
        return pd_error(PD_EINVAL, "add: key '%s': %" PRId64 " + %" PRId64
                        " overflows int64", key, cur, delta);
    }
    int64_t nv = cur + delta;
    char text[24];
    size_t tn = pd_kv_format_int(nv, text);
    if (e == NULL) {
        PD_CHECK(pd_kvmap_get_or_add(m, key, keylen, &e));
    }
    pd_status st = pd_kvmap_store(m, e, text, tn);
    if (st != PD_OK) {
        if (!e->present && e->aux == NULL) {
            pd_kvmap_remove(m, e);
        }
        return st;
    }
    *out = nv;
    *changed = e;
    return PD_OK;
}

pd_status
pd_kv_compare_set(pd_kvmap *m, const char *key, size_t keylen,
                  const uint8_t *expected, size_t explen,
                  const uint8_t *desired, size_t deslen, const uint8_t **res,
                  size_t *reslen, pd_kv_entry **changed)
{
    pd_kv_entry *e = pd_kvmap_find(m, key, keylen);
    *changed = NULL;
    if (e == NULL || !e->present) {
        if (explen != 0) {
            /* torch returns expected here and leaves the key missing. */
            *res = expected;
            *reslen = explen;
            return PD_OK;
        }
    } else if (e->vallen != explen ||
               (explen > 0 && memcmp(e->val, expected, explen) != 0)) {
        *res = e->val;
        *reslen = e->vallen;
        return PD_OK;
    }
    if (e == NULL) {
        PD_CHECK(pd_kvmap_get_or_add(m, key, keylen, &e));
    }
    pd_status st = pd_kvmap_store(m, e, desired, deslen);
    if (st != PD_OK) {
        if (!e->present && e->aux == NULL) {
            pd_kvmap_remove(m, e);
        }
        return st;
    }
    *res = e->val;
    *reslen = e->vallen;
    *changed = e;
    return PD_OK;
}

pd_status
pd_kv_append(pd_kvmap *m, const char *key, size_t keylen, const void *val,
             size_t n, pd_kv_entry **changed)
{
    pd_kv_entry *e = pd_kvmap_find(m, key, keylen);
    size_t cur = (e != NULL && e->present) ? e->vallen : 0;
    *changed = NULL;
    if (n > PD_STORE_MAX_VALUE || cur > PD_STORE_MAX_VALUE - n) {
        return pd_error(PD_EINVAL, "append: the value of key '%s' would exceed "
                        "the limit of %zu bytes", key, PD_STORE_MAX_VALUE);
    }
    uint8_t *nv = malloc(cur + n + 1);
    if (nv == NULL) {
        return pd_error(PD_ENOMEM, "append: out of memory");
    }
    if (cur > 0) {
        memcpy(nv, e->val, cur);
    }
    if (n > 0) {
        memcpy(nv + cur, val, n);
    }
    if (e == NULL) {
        pd_status st = pd_kvmap_get_or_add(m, key, keylen, &e);
        if (st != PD_OK) {
            free(nv);
            return st;
        }
    }
    pd_status st = pd_kvmap_store(m, e, nv, cur + n);
    free(nv);
    if (st != PD_OK) {
        if (!e->present && e->aux == NULL) {
            pd_kvmap_remove(m, e);
        }
        return st;
    }
    *changed = e;
    return PD_OK;
}

pd_status
pd_kvmap_list(const pd_kvmap *m, const char *prefix, char ***out, size_t *n)
{
    size_t plen = prefix != NULL ? strlen(prefix) : 0;
    size_t cnt = 0;
    char **ks = calloc(m->npresent ? m->npresent : 1, sizeof(*ks));
    *out = NULL;
    *n = 0;
    if (ks == NULL) {
        return pd_error(PD_ENOMEM, "list_keys: out of memory");
    }
    for (size_t b = 0; b < m->nbuckets; b++) {
        for (pd_kv_entry *e = m->buckets[b]; e != NULL; e = e->next) {
            if (!e->present || cnt == m->npresent ||
                (plen > 0 && (e->keylen < plen ||
                              memcmp(e->key, prefix, plen) != 0))) {
                continue;
            }
            size_t kl = e->keylen - plen;
            ks[cnt] = malloc(kl + 1);
            if (ks[cnt] == NULL) {
                pd_store_free_keys(ks, cnt);
                return pd_error(PD_ENOMEM, "list_keys: out of memory");
            }
            memcpy(ks[cnt], e->key + plen, kl);
            ks[cnt][kl] = '\0';
            cnt++;
        }
    }
    *out = ks;
    *n = cnt;
    return PD_OK;
}
