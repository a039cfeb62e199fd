/* FileStore: keys shared by processes through one file, as torch's FileStore.
 *
 * The file is a log of records, appended under an exclusive flock():
 *   u8 op ('S' set, 'D' delete), u32 key length, u32 value length (both
 *   little-endian), key bytes, value bytes.
 * Each store replays the log into a private table, reading only what was
 * appended since its last look (under a shared flock, so it never sees half
 * a record).  Read-modify-write operations (add, compare_set, delete) hold
 * the exclusive lock across the replay and the append, which makes them
 * atomic across processes.  get/wait poll the file until the keys appear.
 *
 * Like torch: user keys are stored as "/<key>", "refcount" counts the open
 * stores and "cleanup/" the closed ones; when the last of world_size users
 * closes the file, it is deleted.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kvmap.h"
#include "store.h"

#define USER_PREFIX "/"
#define REFCOUNT_KEY "refcount"
#define CLEANUP_KEY "cleanup/"
#define REC_HDR 9
#define POLL_MIN 0.001
#define POLL_MAX 0.01

typedef struct file_store {
    pd_store base;
    pthread_mutex_t mu;
    int mu_init;
    int fd;
    int registered; /* counted in "refcount" */
    pid_t owner;    /* the process that counted itself */
    int world_size;
    char *path;
    uint64_t pos;   /* bytes of the log replayed into cache */
    pd_kvmap cache;
    uint8_t *buf;
    size_t cap;
} file_store;

static file_store *
fs_of(pd_store *s)
{
    return (file_store *)s;
}

static void
sleep_seconds(double s)
{
    struct timespec ts;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static pd_status
fs_lock(file_store *f, int how)
{
    while (flock(f->fd, how) != 0) {
        if (errno != EINTR) {
            return pd_syserror(PD_ESYS, "FileStore %s: flock", f->path);
        }
    }
    return PD_OK;
}

static void
fs_unlock(file_store *f)
{
    while (flock(f->fd, LOCK_UN) != 0 && errno == EINTR) {
    }
}

static uint32_t
le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static void
put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* Replay what was appended since the last call (caller holds a flock). */
static pd_status
fs_refresh(file_store *f)
{
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        return pd_syserror(PD_ESYS, "FileStore %s: fstat", f->path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    if (size < f->pos) {
        return pd_error(PD_ESTORE, "FileStore %s: the file shrank from %" PRIu64
                        " to %" PRIu64 " bytes; was it rewritten by another "
                        "job?", f->path, f->pos, size);
    }
    if (size == f->pos) {
        return PD_OK;
    }
    size_t n = (size_t)(size - f->pos);
    if (n > f->cap) {
        uint8_t *p = realloc(f->buf, n);
        if (p == NULL) {
            return pd_error(PD_ENOMEM, "FileStore %s: out of memory reading "
                            "%zu bytes", f->path, n);
        }
        f->buf = p;
        f->cap = n;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(f->fd, f->buf + got, n - got,
                          (off_t)(f->pos + got));
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r < 0) {
            return pd_syserror(PD_ESYS, "FileStore %s: pread", f->path);
        }
        if (r == 0) {
            break;
        }
        got += (size_t)r;
    }
    size_t off = 0;
    while (got - off >= REC_HDR) {
        const uint8_t *h = f->buf + off;
        size_t kl = le32(h + 1), vl = le32(h + 5);
        if (got - off - REC_HDR < kl || got - off - REC_HDR - kl < vl) {
            break; /* A record still being written: not ours to read yet. */
        }
        const char *key = (const char *)h + REC_HDR;
        const uint8_t *val = h + REC_HDR + kl;
        pd_kv_entry *e;
        if (h[0] == 'S') {
            PD_CHECK(pd_kvmap_get_or_add(&f->cache, key, kl, &e));
            PD_CHECK(pd_kvmap_store(&f->cache, e, val, vl));
        } else if (h[0] == 'D') {
            e = pd_kvmap_find(&f->cache, key, kl);
            if (e != NULL) {
                pd_kvmap_remove(&f->cache, e);
            }
        } else {
            return pd_error(PD_ESTORE, "FileStore %s: corrupt record at offset "
                            "%" PRIu64 " (is it a FileStore file?)", f->path,
                            f->pos + off);
        }
        off += REC_HDR + kl + vl;
    }
    f->pos += off;
    return PD_OK;
}

/* Append one record and replay it (caller holds the exclusive flock). */
static pd_status
fs_append(file_store *f, char op, const char *key, const void *val, size_t vl)
{
    size_t kl = strlen(key);
    size_t n = REC_HDR + kl + vl;
    uint8_t *rec = malloc(n);
    if (rec == NULL) {
        return pd_error(PD_ENOMEM, "FileStore %s: out of memory", f->path);
    }
    rec[0] = (uint8_t)op;
    put_le32(rec + 1, (uint32_t)kl);
    put_le32(rec + 5, (uint32_t)vl);
    memcpy(rec + REC_HDR, key, kl);
    if (vl > 0) {
        memcpy(rec + REC_HDR + kl, val, vl);
    }
    size_t done = 0;
    pd_status st = PD_OK;
    while (done < n) {
        ssize_t r = write(f->fd, rec + done, n - done);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            st = pd_syserror(PD_ESYS, "FileStore %s: write", f->path);
            break;
        }
        done += (size_t)r;
    }
    free(rec);
    PD_CHECK(st);
    return fs_refresh(f);
}

static char *
user_key(const char *key)
{
    size_t n = strlen(key);
    char *k = malloc(n + 2);
    if (k != NULL) {
        k[0] = '/';
        memcpy(k + 1, key, n + 1);
    }
    return k;
}

static pd_status
oom(file_store *f)
{
    return pd_error(PD_ENOMEM, "FileStore %s: out of memory", f->path);
}

/* Shared-lock replay under the object mutex (the caller holds mu). */
static pd_status
fs_sync_shared(file_store *f)
{
    PD_CHECK(fs_lock(f, LOCK_SH));
    pd_status st = fs_refresh(f);
    fs_unlock(f);
    return st;
}

static pd_status
fs_set(pd_store *s, const char *key, const void *val, size_t n)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_lock(f, LOCK_EX);
    if (st == PD_OK) {
        st = fs_append(f, 'S', k, val, n);
        fs_unlock(f);
    }
    pthread_mutex_unlock(&f->mu);
    free(k);
    return st;
}

static int
fs_all_present(file_store *f, char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        pd_kv_entry *e = pd_kvmap_find(&f->cache, keys[i], strlen(keys[i]));
        if (e == NULL || !e->present) {
            return 0;
        }
    }
    return 1;
}

/* Poll until every (already prefixed) key exists.  With val != NULL, also
 * copy the value of keys[0] out while still holding the mutex. */
static pd_status
fs_wait_keys(file_store *f, char *const *keys, const char *const *shown,
             size_t n, double timeout, uint8_t **val, size_t *vlen)
{
    double deadline = timeout > 0 ? pd_now() + timeout : 0;
    double pause = POLL_MIN;
    for (;;) {
        pthread_mutex_lock(&f->mu);
        pd_status st = fs_sync_shared(f);
        if (st == PD_OK && fs_all_present(f, keys, n)) {
            if (val != NULL) {
                pd_kv_entry *e = pd_kvmap_find(&f->cache, keys[0],
                                               strlen(keys[0]));
                st = pd_kv_dup(e->val, e->vallen, val);
                if (st == PD_OK) {
                    *vlen = e->vallen;
                }
            }
            pthread_mutex_unlock(&f->mu);
            return st;
        }
        pthread_mutex_unlock(&f->mu);
        PD_CHECK(st);
        if (deadline > 0 && pd_now() >= deadline) {
            return pd_store_timeout_error(USER_PREFIX, timeout, shown, n);
        }
        double left = deadline > 0 ? deadline - pd_now() : pause;
        sleep_seconds(left < pause ? (left > 0 ? left : 0) : pause);
        pause = pause * 2 > POLL_MAX ? POLL_MAX : pause * 2;
    }
}

static pd_status
fs_get(pd_store *s, const char *key, double timeout, uint8_t **val,
       size_t *n)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pd_status st = fs_wait_keys(f, &k, &key, 1, timeout, val, n);
    free(k);
    return st;
}

/* The new counter value for key (caller holds the exclusive lock and has
 * refreshed); does not write. */
static pd_status
fs_next_count(file_store *f, const char *key, int64_t delta, int64_t *out)
{
    int64_t cur = 0;
    pd_kv_entry *e = pd_kvmap_find(&f->cache, key, strlen(key));
    if (e != NULL && e->present) {
        PD_CHECK(pd_kv_parse_int(key, e->val, e->vallen, &cur));
    }
    if ((delta > 0 && cur > INT64_MAX - delta) ||
        (delta < 0 && cur < INT64_MIN - delta)) {
        return pd_error(PD_EINVAL, "add: key '%s': %" PRId64 " + %" PRId64
                        " overflows int64", key, cur, delta);
    }
    *out = cur + delta;
    return PD_OK;
}

/* add with the exclusive lock already held. */
static pd_status
fs_add_locked(file_store *f, const char *key, int64_t delta, int64_t *out)
{
    char text[24];
    PD_CHECK(fs_refresh(f));
    PD_CHECK(fs_next_count(f, key, delta, out));
    size_t tn = pd_kv_format_int(*out, text);
    return fs_append(f, 'S', key, text, tn);
}

static pd_status
fs_add_raw(file_store *f, const char *key, int64_t delta, int64_t *out)
{
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_lock(f, LOCK_EX);
    if (st == PD_OK) {
        st = fs_add_locked(f, key, delta, out);
        fs_unlock(f);
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static pd_status
fs_add(pd_store *s, const char *key, int64_t delta, int64_t *out)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pd_status st = fs_add_raw(f, k, delta, out);
    free(k);
    return st;
}

static pd_status
fs_compare_set(pd_store *s, const char *key, const void *expected,
               size_t explen, const void *desired, size_t deslen,
               uint8_t **out, size_t *outlen)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_lock(f, LOCK_EX);
    if (st != PD_OK) {
        goto out;
    }
    PD_CHECK_GOTO(fs_refresh(f), st, unlock);
    pd_kv_entry *e = pd_kvmap_find(&f->cache, k, strlen(k));
    const void *res;
    size_t reslen;
    if (e == NULL || !e->present) {
        if (explen != 0) {
            /* torch: a missing key with non-empty expected stays missing
             * and the call returns expected. */
            res = expected;
            reslen = explen;
        } else {
            PD_CHECK_GOTO(fs_append(f, 'S', k, desired, deslen), st, unlock);
            res = desired;
            reslen = deslen;
        }
    } else if (e->vallen != explen ||
               (explen > 0 && memcmp(e->val, expected, explen) != 0)) {
        res = e->val;
        reslen = e->vallen;
    } else {
        PD_CHECK_GOTO(fs_append(f, 'S', k, desired, deslen), st, unlock);
        res = desired;
        reslen = deslen;
    }
    st = pd_kv_dup(res, reslen, out);
    if (st == PD_OK) {
        *outlen = reslen;
    }
unlock:
    fs_unlock(f);
out:
    pthread_mutex_unlock(&f->mu);
    free(k);
    return st;
}

static pd_status
fs_wait(pd_store *s, const char *const *keys, size_t n, double timeout)
{
    file_store *f = fs_of(s);
    char **ks = pd_store_prefix_keys("/", 1, keys, n);
    if (ks == NULL) {
        return oom(f);
    }
    pd_status st = fs_wait_keys(f, ks, keys, n, timeout, NULL, NULL);
    pd_store_free_keys(ks, n);
    return st;
}

static pd_status
fs_check(pd_store *s, const char *const *keys, size_t n, int *out)
{
    file_store *f = fs_of(s);
    char **ks = pd_store_prefix_keys("/", 1, keys, n);
    if (ks == NULL) {
        return oom(f);
    }
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_sync_shared(f);
    if (st == PD_OK) {
        *out = fs_all_present(f, ks, n);
    }
    pthread_mutex_unlock(&f->mu);
    pd_store_free_keys(ks, n);
    return st;
}

static pd_status
fs_delete_key(pd_store *s, const char *key, int *deleted)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_lock(f, LOCK_EX);
    if (st == PD_OK) {
        st = fs_refresh(f);
        if (st == PD_OK) {
            pd_kv_entry *e = pd_kvmap_find(&f->cache, k, strlen(k));
            if (e != NULL && e->present) {
                st = fs_append(f, 'D', k, NULL, 0);
            }
            /* torch's FileStore answers true whether or not the key
             * existed. */
            *deleted = st == PD_OK;
        }
        fs_unlock(f);
    }
    pthread_mutex_unlock(&f->mu);
    free(k);
    return st;
}

static pd_status
fs_num_keys(pd_store *s, int64_t *out)
{
    file_store *f = fs_of(s);
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_sync_shared(f);
    if (st == PD_OK) {
        *out = (int64_t)f->cache.npresent;
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static pd_status
fs_append_value(pd_store *s, const char *key, const void *val, size_t n)
{
    file_store *f = fs_of(s);
    char *k = user_key(key);
    if (k == NULL) {
        return oom(f);
    }
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_lock(f, LOCK_EX);
    if (st != PD_OK) {
        goto out;
    }
    PD_CHECK_GOTO(fs_refresh(f), st, unlock);
    pd_kv_entry *e = pd_kvmap_find(&f->cache, k, strlen(k));
    size_t cur = (e != NULL && e->present) ? e->vallen : 0;
    if (cur > PD_STORE_MAX_VALUE - n) {
        st = pd_error(PD_EINVAL, "FileStore.append: the value of key '%s' "
                      "would exceed the limit of %zu bytes", key,
                      PD_STORE_MAX_VALUE);
        goto unlock;
    }
    uint8_t *nv = malloc(cur + n + 1);
    if (nv == NULL) {
        st = oom(f);
        goto unlock;
    }
    if (cur > 0) {
        memcpy(nv, e->val, cur);
    }
    if (n > 0) {
        memcpy(nv + cur, val, n);
    }
    st = fs_append(f, 'S', k, nv, cur + n);
    free(nv);
unlock:
    fs_unlock(f);
out:
    pthread_mutex_unlock(&f->mu);
    free(k);
    return st;
}

static pd_status
fs_list_keys(pd_store *s, char ***keys, size_t *n)
{
    file_store *f = fs_of(s);
    pthread_mutex_lock(&f->mu);
    pd_status st = fs_sync_shared(f);
    if (st == PD_OK) {
        st = pd_kvmap_list(&f->cache, USER_PREFIX, keys, n);
    }
    pthread_mutex_unlock(&f->mu);
    return st;
}

static void
fs_destroy(pd_store *s)
{
    file_store *f = fs_of(s);
    /* A child made by fork() shares the parent's count: leave it alone. */
    if (f->registered && f->owner == getpid() && fs_lock(f, LOCK_EX) == PD_OK) {
        /* torch's rule: the last of world_size users deletes the file.
         * Failures only leave the file behind. */
        int64_t finished = 0, refs = 1;
        if (fs_add_locked(f, CLEANUP_KEY, 1, &finished) == PD_OK &&
            fs_add_locked(f, REFCOUNT_KEY, -1, &refs) == PD_OK &&
            refs == 0 && f->world_size >= 0 && finished >= f->world_size) {
            (void)unlink(f->path);
        }
        fs_unlock(f);
    }
    if (f->fd >= 0) {
        (void)close(f->fd);
    }
    pd_kvmap_free(&f->cache);
    free(f->buf);
    free(f->path);
    if (f->mu_init) {
        pthread_mutex_destroy(&f->mu);
    }
    free(f);
}

static const pd_store_ops file_ops = {
    .name = "FileStore",
    .set = fs_set,
    .get = fs_get,
    .add = fs_add,
    .compare_set = fs_compare_set,
    .wait = fs_wait,
    .check = fs_check,
    .delete_key = fs_delete_key,
    .num_keys = fs_num_keys,
    .append = fs_append_value,
    .list_keys = fs_list_keys,
    .destroy = fs_destroy,
};

pd_status
pd_file_store_new(const char *path, int world_size, double timeout,
                  pd_store **out)
{
    pd_status st = PD_OK;
    int64_t refs;
    file_store *f;

    *out = NULL;
    if (path == NULL || path[0] == '\0') {
        return pd_error(PD_EINVAL, "FileStore: file_name must not be empty");
    }
    f = calloc(1, sizeof(*f));
    if (f == NULL) {
        return pd_error(PD_ENOMEM, "FileStore: out of memory");
    }
    f->base.ops = &file_ops;
    f->fd = -1;
    f->world_size = world_size;
    pd_store_set_timeout(&f->base, timeout);
    f->path = strdup(path);
    if (f->path == NULL) {
        st = pd_error(PD_ENOMEM, "FileStore: out of memory");
        goto fail;
    }
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        st = pd_error(PD_ESYS, "FileStore: pthread_mutex_init failed");
        goto fail;
    }
    f->mu_init = 1;
    PD_CHECK_GOTO(pd_kvmap_init(&f->cache), st, fail);
    /* 0600: the file holds the group token and the ranks' addresses */
    do {
        f->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    } while (f->fd < 0 && errno == EINTR);
    if (f->fd < 0) {
        st = pd_syserror(PD_ESYS, "FileStore: open %s", path);
        goto fail;
    }
    PD_CHECK_GOTO(fs_add_raw(f, REFCOUNT_KEY, 1, &refs), st, fail);
    f->registered = 1;
    f->owner = getpid();
    *out = &f->base;
    return PD_OK;
fail:
    fs_destroy(&f->base);
    return st;
}

const char *
pd_file_store_path(const pd_store *s)
{
    if (s == NULL || s->ops != &file_ops) {
        return NULL;
    }
    return ((const file_store *)s)->path;
}
