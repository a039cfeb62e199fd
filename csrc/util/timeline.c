/* The timeline writer (timeline.h): one file per process, one mutex. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "timeline.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

atomic_int pd_tl_on = 0;

static pthread_mutex_t tl_mu = PTHREAD_MUTEX_INITIALIZER;
static FILE *tl_file;
static int tl_pid;
static long tl_events;

double
pd_wall(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int
pd_tl_pid(void)
{
    return tl_pid;
}

/* s as a JSON string's contents */
static void
put_escaped(FILE *f, const char *s)
{
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
}

static void
event_locked(const char *name, const char *cat, char ph, double ts_us,
             double dur_us, int tid, const char *args)
{
    FILE *f = tl_file;
    fputs(tl_events++ ? ",\n{\"name\":\"" : "[\n{\"name\":\"", f);
    put_escaped(f, name);
    fputs("\",\"cat\":\"", f);
    put_escaped(f, cat);
    fprintf(f, "\",\"ph\":\"%c\",\"pid\":%d,\"tid\":%d", ph, tl_pid, tid);
    if (ph != 'M') {
        fprintf(f, ",\"ts\":%.3f", ts_us);
    }
    if (ph == 'X') {
        fprintf(f, ",\"dur\":%.3f", dur_us > 0 ? dur_us : 0.0);
    }
    if (ph == 'i') {
        fputs(",\"s\":\"t\"", f);
    }
    if (args != NULL && args[0]) {
        fputs(",\"args\":", f);
        fputs(args, f);
    }
    fputc('}', f);
}

pd_status
pd_tl_open(const char *path, int pid, const char *process_name)
{
    pthread_mutex_lock(&tl_mu);
    if (tl_file != NULL) {
        fclose(tl_file);
        tl_file = NULL;
    }
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        int e = errno;
        pthread_mutex_unlock(&tl_mu);
        return pd_error(PD_EINVAL, "timeline: cannot write %s: %s", path,
                        strerror(e));
    }
    tl_file = f;
    tl_pid = pid;
    tl_events = 0;
    char args[256];
    char esc[200];
    size_t j = 0;
    for (const char *s = process_name; *s && j + 2 < sizeof(esc); s++) {
        if (*s == '"' || *s == '\\' || (unsigned char)*s < 0x20) {
            continue;
        }
        esc[j++] = *s;
    }
    esc[j] = '\0';
    snprintf(args, sizeof(args), "{\"name\":\"%s\"}", esc);
    event_locked("process_name", "__metadata", 'M', 0, 0, 0, args);
    snprintf(args, sizeof(args), "{\"sort_index\":%d}", pid);
    event_locked("process_sort_index", "__metadata", 'M', 0, 0, 0, args);
    fflush(f);
    atomic_store(&pd_tl_on, 1);
    pthread_mutex_unlock(&tl_mu);
    return PD_OK;
}

void
pd_tl_event(const char *name, const char *cat, char ph, double ts_us,
            double dur_us, int tid, const char *args)
{
    pthread_mutex_lock(&tl_mu);
    if (tl_file != NULL) {
        event_locked(name, cat, ph, ts_us, dur_us, tid, args);
    }
    pthread_mutex_unlock(&tl_mu);
}

void
pd_tl_flush(void)
{
    pthread_mutex_lock(&tl_mu);
    if (tl_file != NULL) {
        fflush(tl_file);
    }
    pthread_mutex_unlock(&tl_mu);
}

void
pd_tl_close(void)
{
    pthread_mutex_lock(&tl_mu);
    atomic_store(&pd_tl_on, 0);
    if (tl_file != NULL) {
        fputs(tl_events ? "\n]\n" : "[]\n", tl_file);
        fclose(tl_file);
        tl_file = NULL;
    }
    pthread_mutex_unlock(&tl_mu);
}
