/* The flight recorder (flight.h). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "flight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../coll/coll.h"
#include "../util/kinds.h"
#include "../kernels/kernels.h"
#include "../util/timeline.h"

#define FR_DEFAULT 2000
#define FR_MAX (1u << 22)

size_t
pd_fr_default_capacity(void)
{
    const char *v = getenv("PYDDP_FLIGHT_RECORDER_SIZE");
    if (v == NULL || !v[0]) {
        v = getenv("TORCH_FR_BUFFER_SIZE");
    }
    if (v == NULL || !v[0]) {
        return FR_DEFAULT;
    }
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (errno != 0 || *end != '\0' || n < 0) {
        return FR_DEFAULT;
    }
    return n > FR_MAX ? FR_MAX : (size_t)n;
}

pd_status
pd_fr_init(pd_fr *fr, size_t cap)
{
    memset(fr, 0, sizeof(*fr));
    pthread_mutex_init(&fr->mu, NULL);
    fr->tl_tid = -1;
    if (cap > 0) {
        /* committed now (malloc + memset, not calloc's lazily mapped
         * pages): the ring's memory does not creep up as it fills */
        fr->e = malloc(cap * sizeof(pd_fr_entry));
        if (fr->e != NULL) {
            memset(fr->e, 0, cap * sizeof(pd_fr_entry));
        }
        if (fr->e == NULL) {
            return pd_error(PD_ENOMEM, "flight recorder: out of memory for "
                            "%zu entries", cap);
        }
    }
    fr->cap = cap;
    return PD_OK;
}

void
pd_fr_free(pd_fr *fr)
{
    free(fr->e);
    free(fr->dump_path);
    free(fr->meta);
    pthread_mutex_destroy(&fr->mu);
    memset(fr, 0, sizeof(*fr));
}

const char *
pd_fr_state_name(int state)
{
    switch (state) {
    case PD_FR_ENQUEUED:
        return "enqueued";
    case PD_FR_STARTED:
        return "started";
    case PD_FR_COMPLETED:
        return "completed";
    default:
        return "failed";
    }
}

static uint64_t
op_bytes(const pd_op *op, int size)
{
    if (op->kind == PD_K_ALLTOALL && op->in_len != NULL) {
        uint64_t b = 0;
        for (int p = 0; p < size && p < op->nblocks; p++) {
            b += op->in_len[p];
        }
        return b;
    }
    return (uint64_t)op->count * pd_dtype_size(op->dtype);
}

static pd_fr_entry *
find(pd_fr *fr, uint64_t id)
{
    if (id == 0 || fr->cap == 0) {
        return NULL;
    }
    pd_fr_entry *e = &fr->e[(id - 1) % fr->cap];
    return e->id == id ? e : NULL;
}

uint64_t
pd_fr_add(pd_fr *fr, const pd_op *op, uint64_t seq, int size)
{
    if (fr->cap == 0 && !pd_tl_enabled()) {
        return 0;
    }
    double now = pd_wall();
    pthread_mutex_lock(&fr->mu);
    uint64_t id = 0;
    if (fr->cap > 0) {
        id = ++fr->next;
        pd_fr_entry *e = &fr->e[(id - 1) % fr->cap];
        memset(e, 0, sizeof(*e));
        e->id = id;
        e->seq = seq;
        e->count = op->count;
        e->bytes = op_bytes(op, size);
        e->root = op->root;
        e->kind = (uint8_t)op->kind;
        e->dtype = (uint8_t)op->dtype;
        e->op = (uint8_t)op->op;
        e->t_enqueued = now;
        if (seq != 0) {
            e->t_started = now;
            e->state = PD_FR_STARTED;
        }
        pd_strlcpy(e->name, op->name, sizeof(e->name));
    }
    pthread_mutex_unlock(&fr->mu);
    return id;
}

void
pd_fr_start(pd_fr *fr, uint64_t id, uint64_t seq)
{
    if (id == 0) {
        return;
    }
    double now = pd_wall();
    pthread_mutex_lock(&fr->mu);
    pd_fr_entry *e = find(fr, id);
    if (e != NULL && e->state == PD_FR_ENQUEUED) {
        e->seq = seq;
        e->t_started = now;
        e->state = PD_FR_STARTED;
    }
    pthread_mutex_unlock(&fr->mu);
}

void
pd_fr_names(const pd_fr *fr, const pd_fr_entry *e, const char **backend,
            const char **transport, const char **algorithm)
{
    if (e->via == 0 || e->via >= PD_FR_VIAS) {
        *backend = "cpu";
        *transport = pd_path_name(e->path);
        *algorithm = pd_algo_name(e->algo);
        return;
    }
    *backend = fr->via[e->via][0];
    *transport = fr->via[e->via][1];
    *algorithm = fr->via[e->via][2];
}

static void
timeline_events(const pd_fr *fr, const pd_fr_entry *e)
{
    const char *be, *tr, *al;
    pd_fr_names(fr, e, &be, &tr, &al);
    char args[512];
    snprintf(args, sizeof(args),
             "{\"seq\":%llu,\"bytes\":%llu,\"count\":%llu,\"dtype\":\"%s\","
             "\"backend\":\"%s\",\"transport\":\"%s\",\"algorithm\":\"%s\","
             "\"status\":\"%s\"}",
             (unsigned long long)e->seq, (unsigned long long)e->bytes,
             (unsigned long long)e->count,
             pd_dtype_name((pd_dtype)e->dtype), be, tr, al,
             e->state == PD_FR_COMPLETED ? "ok" : pd_status_name(e->status));
    int tid = fr->tl_tid >= 0 ? fr->tl_tid : 0;
    if (e->t_started > e->t_enqueued) {
        char qname[56];
        snprintf(qname, sizeof(qname), "%s (queued)", e->name);
        pd_tl_event(qname, "queued", 'X', e->t_enqueued * 1e6,
                    (e->t_started - e->t_enqueued) * 1e6, tid, args);
    }
    pd_tl_event(e->name, "collective", 'X', e->t_started * 1e6,
                (e->t_ended - e->t_started) * 1e6, tid, args);
}

void
pd_fr_end(pd_fr *fr, uint64_t id, pd_status st, int path, int algo)
{
    if (id == 0) {
        return;
    }
    double now = pd_wall();
    pthread_mutex_lock(&fr->mu);
    pd_fr_entry *e = find(fr, id);
    pd_fr_entry copy;
    int emit = 0;
    if (e != NULL && e->state != PD_FR_COMPLETED &&
        e->state != PD_FR_FAILED) {
        if (e->t_started == 0) {
            e->t_started = now;
        }
        e->t_ended = now;
        e->status = (int32_t)st;
        e->path = (uint8_t)path;
        e->algo = (uint8_t)algo;
        e->state = st == PD_OK ? PD_FR_COMPLETED : PD_FR_FAILED;
        if (pd_tl_enabled()) {
            copy = *e;
            emit = 1;
        }
    }
    pthread_mutex_unlock(&fr->mu);
    if (emit) {
        timeline_events(fr, &copy);
    }
}

/* ------------------------------------------- device backends' calls */

static void
via_name(char *dst, const char *src)
{
    pd_strlcpy(dst, src != NULL && src[0] ? src : "?", PD_FR_VIA_LEN);
    for (char *p = dst; *p; p++) { /* JSON and the timeline carry it as is */
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 0x20) {
            *p = '_';
        }
    }
}

int
pd_fr_via(pd_fr *fr, const char *backend, const char *transport,
          const char *algorithm)
{
    char n[3][PD_FR_VIA_LEN];
    memset(n, 0, sizeof(n)); /* compared whole */
    via_name(n[0], backend);
    via_name(n[1], transport);
    via_name(n[2], algorithm);
    pthread_mutex_lock(&fr->mu);
    int k;
    for (k = 1; k <= fr->nvia; k++) {
        if (memcmp(fr->via[k], n, sizeof(n)) == 0) {
            break;
        }
    }
    if (k > fr->nvia) {
        if (k < PD_FR_VIAS) {
            memcpy(fr->via[k], n, sizeof(n));
            fr->nvia = k;
        }
        else {
            k = -1;
        }
    }
    pthread_mutex_unlock(&fr->mu);
    return k;
}

uint64_t
pd_fr_note(pd_fr *fr, int via, int kind, int dtype, int op, int root,
           uint64_t count, uint64_t bytes, const char *name, int collective)
{
    if (fr->cap == 0 || via <= 0 || via >= PD_FR_VIAS) {
        return 0;
    }
    double now = pd_wall();
    pthread_mutex_lock(&fr->mu);
    uint64_t id = 0;
    if (via <= fr->nvia) {
        id = ++fr->next;
        pd_fr_entry *e = &fr->e[(id - 1) % fr->cap];
        memset(e, 0, sizeof(*e));
        e->id = id;
        e->seq = collective ? ++fr->via_seq[via] : 0;
        e->count = count;
        e->bytes = bytes;
        e->root = root;
        e->kind = (uint8_t)kind;
        e->dtype = (uint8_t)dtype;
        e->op = (uint8_t)op;
        e->via = (uint8_t)via;
        e->t_enqueued = now;
        pd_strlcpy(e->name, name != NULL ? name : "", sizeof(e->name));
    }
    pthread_mutex_unlock(&fr->mu);
    return id;
}

void
pd_fr_update(pd_fr *fr, uint64_t id, int state, pd_status st)
{
    if (id == 0) {
        return;
    }
    double now = pd_wall();
    pthread_mutex_lock(&fr->mu);
    pd_fr_entry *e = find(fr, id);
    pd_fr_entry copy;
    int emit = 0;
    if (e != NULL && e->state < PD_FR_COMPLETED) {
        if (state == PD_FR_STARTED) {
            if (e->state == PD_FR_ENQUEUED) {
                e->t_started = now;
                e->state = PD_FR_STARTED;
            }
        }
        else if (state == PD_FR_COMPLETED || state == PD_FR_FAILED) {
            if (e->t_started == 0) {
                e->t_started = now;
            }
            e->t_ended = now;
            e->state = (uint8_t)state;
            e->status = state == PD_FR_COMPLETED
                            ? PD_OK
                            : (int32_t)(st == PD_OK ? PD_EBACKEND : st);
            if (pd_tl_enabled()) {
                copy = *e;
                emit = 1;
            }
        }
    }
    pthread_mutex_unlock(&fr->mu);
    if (emit) {
        timeline_events(fr, &copy);
    }
}

size_t
pd_fr_fail_open(pd_fr *fr, pd_status st)
{
    if (st == PD_OK) {
        st = PD_EBACKEND;
    }
    double now = pd_wall();
    size_t n = 0;
    pthread_mutex_lock(&fr->mu);
    uint64_t last = fr->next;
    uint64_t first = last > fr->cap ? last - fr->cap + 1 : 1;
    int tl = pd_tl_enabled();
    for (uint64_t id = first; fr->cap > 0 && fr->nvia > 0 && id <= last;
         id++) {
        pd_fr_entry *e = find(fr, id);
        if (e == NULL || e->via == 0 || e->state >= PD_FR_COMPLETED) {
            continue;
        }
        if (e->t_started == 0) {
            e->t_started = now;
        }
        e->t_ended = now;
        e->state = PD_FR_FAILED;
        e->status = (int32_t)st;
        n++;
        if (tl) { /* rare: under the lock */
            timeline_events(fr, e);
        }
    }
    pthread_mutex_unlock(&fr->mu);
    return n;
}

size_t
pd_fr_snapshot(pd_fr *fr, pd_fr_entry *out, size_t cap)
{
    pthread_mutex_lock(&fr->mu);
    size_t n = 0;
    if (fr->cap > 0) {
        uint64_t last = fr->next;
        uint64_t first = last > fr->cap ? last - fr->cap + 1 : 1;
        for (uint64_t id = first; id <= last && n < cap; id++) {
            pd_fr_entry *e = find(fr, id);
            if (e != NULL) {
                out[n++] = *e;
            }
        }
    }
    pthread_mutex_unlock(&fr->mu);
    return n;
}

pd_status
pd_fr_configure(pd_fr *fr, const char *path, const char *meta)
{
    char *p = path != NULL && path[0] ? strdup(path) : NULL;
    char *m = meta != NULL && meta[0] ? strdup(meta) : NULL;
    if ((path != NULL && path[0] && p == NULL) ||
        (meta != NULL && meta[0] && m == NULL)) {
        free(p);
        free(m);
        return pd_error(PD_ENOMEM, "flight recorder: out of memory");
    }
    pthread_mutex_lock(&fr->mu);
    free(fr->dump_path);
    free(fr->meta);
    fr->dump_path = p;
    fr->meta = m;
    fr->dumped = 0;
    pthread_mutex_unlock(&fr->mu);
    return PD_OK;
}

static void
put_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            fputc('\\', f);
            fputc(ch, f);
        }
        else if (ch < 0x20) {
            fprintf(f, "\\u%04x", ch);
        }
        else {
            fputc(ch, f);
        }
    }
    fputc('"', f);
}

pd_status
pd_fr_dump(pd_fr *fr, const char *path, const char *reason, int once)
{
    pthread_mutex_lock(&fr->mu);
    if (path == NULL) {
        path = fr->dump_path;
    }
    if (path == NULL || (once && fr->dumped)) {
        pthread_mutex_unlock(&fr->mu);
        return PD_OK;
    }
    if (once) {
        fr->dumped = 1;
    }
    /* write beside the target, then rename: a reader never sees half */
    size_t plen = strlen(path) + 32;
    char *tmp = malloc(plen);
    if (tmp == NULL) {
        pthread_mutex_unlock(&fr->mu);
        return pd_error(PD_ENOMEM, "flight recorder: out of memory");
    }
    snprintf(tmp, plen, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (f == NULL) {
        int e = errno;
        pthread_mutex_unlock(&fr->mu);
        pd_status st = pd_error(PD_EINVAL, "flight recorder: cannot write "
                                "%s: %s", tmp, strerror(e));
        free(tmp);
        return st;
    }
    fputs("{\"version\": 1, \"reason\": ", f);
    put_string(f, reason != NULL ? reason : "on demand");
    fprintf(f, ", \"time\": %.6f, \"pid\": %d, \"capacity\": %zu, "
            "\"recorded\": %llu,\n \"meta\": %s,\n \"entries\": [",
            pd_wall(), (int)getpid(), fr->cap,
            (unsigned long long)fr->next, fr->meta ? fr->meta : "{}");
    uint64_t last = fr->next;
    uint64_t first = last > fr->cap ? last - fr->cap + 1 : 1;
    int k = 0;
    for (uint64_t id = first; fr->cap > 0 && id <= last; id++) {
        pd_fr_entry *e = find(fr, id);
        if (e == NULL) {
            continue;
        }
        fputs(k++ ? ",\n  {" : "\n  {", f);
        fprintf(f, "\"id\": %llu, \"seq\": %llu, \"name\": ",
                (unsigned long long)e->id, (unsigned long long)e->seq);
        put_string(f, e->name);
        const char *be, *tr, *al;
        pd_fr_names(fr, e, &be, &tr, &al);
        fprintf(f, ", \"kind\": \"%s\", \"dtype\": \"%s\", \"op\": \"%s\", "
                "\"root\": %d, \"count\": %llu, \"bytes\": %llu, "
                "\"backend\": \"%s\", \"transport\": \"%s\", "
                "\"algorithm\": \"%s\", "
                "\"state\": \"%s\", \"status\": \"%s\", "
                "\"t_enqueued\": %.6f, \"t_started\": %.6f, "
                "\"t_ended\": %.6f}",
                pd_kind_name(e->kind), pd_dtype_name((pd_dtype)e->dtype),
                pd_redop_name((pd_redop)e->op), (int)e->root,
                (unsigned long long)e->count, (unsigned long long)e->bytes,
                be, tr, al,
                pd_fr_state_name(e->state),
                e->state >= PD_FR_COMPLETED
                    ? pd_status_name((pd_status)e->status)
                    : "",
                e->t_enqueued, e->t_started, e->t_ended);
    }
    fputs("\n ]}\n", f);
    pthread_mutex_unlock(&fr->mu);
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        unlink(tmp);
        free(tmp);
        return pd_error(PD_EINVAL, "flight recorder: writing %s failed",
                        path);
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        free(tmp);
        return pd_error(PD_EINVAL, "flight recorder: cannot write %s: %s",
                        path, strerror(e));
    }
    free(tmp);
    return PD_OK;
}
