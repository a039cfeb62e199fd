/* Internal: the key-value table every store keeps (the TCP server, the hash
 * store, the file store's cache) and the value semantics they share (add,
 * compare_set), so all stores agree on them. */
#ifndef PD_STORE_KVMAP_H
#define PD_STORE_KVMAP_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

/* Entries are allocated one by one, so pointers to them stay valid while
 * the table grows (the TCP server links waiters to entries).  An entry may
 * exist without a value (present == 0) while someone waits for its key. */
typedef struct pd_kv_entry {
    struct pd_kv_entry *next;
    uint64_t hash;
    uint8_t *val;  /* malloc'd, vallen bytes + a NUL */
    size_t vallen;
    int present;
    void *aux;     /* owner's use (the server's waiter list) */
    size_t keylen;
    char key[];    /* NUL-terminated */
} pd_kv_entry;

typedef struct pd_kvmap {
    pd_kv_entry **buckets;
    size_t nbuckets;
    size_t nentries;
    size_t npresent;
} pd_kvmap;

pd_status pd_kvmap_init(pd_kvmap *m);
/* Frees every entry and the table; accepts a zeroed map. */
void pd_kvmap_free(pd_kvmap *m);
pd_kv_entry *pd_kvmap_find(const pd_kvmap *m, const char *key, size_t keylen);
/* Find or insert a value-less entry. */
pd_status pd_kvmap_get_or_add(pd_kvmap *m, const char *key, size_t keylen,
                              pd_kv_entry **out);
/* Copy val into e and mark it present. */
pd_status pd_kvmap_store(pd_kvmap *m, pd_kv_entry *e, const void *val,
                         size_t n);
/* Unlink and free e. */
void pd_kvmap_remove(pd_kvmap *m, pd_kv_entry *e);
/* Drop e's value; free e too unless e->aux is set.  Returns 1 if e was
 * present. */
int pd_kvmap_unset(pd_kvmap *m, pd_kv_entry *e);

/* Parse a counter value: optional spaces, optional sign, decimal digits,
 * optional trailing spaces; PD_EINVAL naming the key otherwise. */
pd_status pd_kv_parse_int(const char *key, const uint8_t *v, size_t n,
                          int64_t *out);
/* Decimal text of v into buf (at least 24 bytes); returns its length. */
size_t pd_kv_format_int(int64_t v, char *buf);

/* add: *out = value + delta; *changed = e (to wake its waiters). */
pd_status pd_kv_add(pd_kvmap *m, const char *key, size_t keylen,
                    int64_t delta, int64_t *out, pd_kv_entry **changed);
/* compare_set with torch's rules (see store.h).  *res points into the entry
 * or at expected; valid until the map changes.  *changed is set when the
 * key got a value. */
pd_status pd_kv_compare_set(pd_kvmap *m, const char *key, size_t keylen,
                            const uint8_t *expected, size_t explen,
                            const uint8_t *desired, size_t deslen,
                            const uint8_t **res, size_t *reslen,
                            pd_kv_entry **changed);

/* append: the value of key becomes its current value (empty when missing)
 * followed by val; *changed = e (to wake its waiters). */
pd_status pd_kv_append(pd_kvmap *m, const char *key, size_t keylen,
                       const void *val, size_t n, pd_kv_entry **changed);
/* The keys of the present entries whose key starts with skip_prefix (NULL:
 * all), with that prefix removed: a malloc'd array of *n malloc'd strings
 * (free with pd_store_free_keys); entries in table order. */
pd_status pd_kvmap_list(const pd_kvmap *m, const char *prefix, char ***out,
                        size_t *n);

/* A heap copy of n bytes plus a NUL, for values handed to callers. */
pd_status pd_kv_dup(const void *p, size_t n, uint8_t **out);

#endif
