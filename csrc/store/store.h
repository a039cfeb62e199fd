/* Rendezvous key-value stores: TCP (server thread + clients), file, in-memory
 * (hash), behind one interface (a struct of function pointers).
 *
 * Semantics follow torch.distributed's stores:
 *   set          overwrite a key.
 *   get          wait until the key exists (up to the timeout), return its value.
 *   add          atomic int64 counter stored as decimal ASCII ("3"); a missing
 *                key counts as 0; returns the new value.
 *   compare_set  key missing and expected empty -> set desired; current ==
 *                expected -> set desired.  Returns the value after the call,
 *                except that a missing key with non-empty expected returns
 *                expected (torch does the same) and stays missing.
 *   wait         until every key exists; PD_ESTORE "wait timeout after
 *                1000ms, keys: /a, /b" otherwise.
 *   check        1 when every key exists, without waiting.
 *   delete_key   1 when the key existed.
 *   num_keys     keys present, internal ones included (as torch counts them).
 *   append       the value becomes the current one (empty if missing) + val.
 *   list_keys    the user keys present (internal ones left out).
 *
 * Timeouts are in seconds: > 0 a limit, 0 (or less) no limit.  The *_timeout
 * variants accept PD_STORE_DEFAULT_TIMEOUT to use the store's own timeout.
 * Values returned through uint8_t ** are malloc'd (free with free()); they
 * carry one extra NUL byte after the value for convenience.
 * Keys are NUL-terminated strings; values are arbitrary bytes.
 * Every store may be used from several threads at once.
 */
#ifndef PD_STORE_STORE_H
#define PD_STORE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "../util/status.h"

#define PD_STORE_DEFAULT_TIMEOUT (-1.0)

/* Largest value (and request) a store accepts. */
#define PD_STORE_MAX_VALUE ((size_t)1 << 30)

typedef struct pd_store pd_store;

typedef struct pd_store_ops {
    const char *name; /* "TCPStore", "FileStore", ... */
    pd_status (*set)(pd_store *s, const char *key, const void *val, size_t n);
    pd_status (*get)(pd_store *s, const char *key, double timeout,
                     uint8_t **val, size_t *n);
    pd_status (*add)(pd_store *s, const char *key, int64_t delta,
                     int64_t *out);
    pd_status (*compare_set)(pd_store *s, const char *key, const void *expected,
                             size_t expected_len, const void *desired,
                             size_t desired_len, uint8_t **out,
                             size_t *out_len);
    pd_status (*wait)(pd_store *s, const char *const *keys, size_t nkeys,
                      double timeout);
    pd_status (*check)(pd_store *s, const char *const *keys, size_t nkeys,
                       int *out);
    pd_status (*delete_key)(pd_store *s, const char *key, int *deleted);
    pd_status (*num_keys)(pd_store *s, int64_t *out);
    /* Value of key becomes its current value (empty if missing) + val. */
    pd_status (*append)(pd_store *s, const char *key, const void *val,
                        size_t n);
    /* The user keys present: malloc'd array of malloc'd strings. */
    pd_status (*list_keys)(pd_store *s, char ***keys, size_t *n);
    void (*destroy)(pd_store *s);
} pd_store_ops;

struct pd_store {
    const pd_store_ops *ops;
    _Atomic double timeout; /* default timeout, seconds; <= 0 none */
};

/* Generic calls (dispatch through ops; check arguments). */
pd_status pd_store_set(pd_store *s, const char *key, const void *val,
                       size_t n);
pd_status pd_store_get(pd_store *s, const char *key, uint8_t **val,
                       size_t *n);
pd_status pd_store_get_timeout(pd_store *s, const char *key, double timeout,
                               uint8_t **val, size_t *n);
pd_status pd_store_add(pd_store *s, const char *key, int64_t delta,
                       int64_t *out);
pd_status pd_store_compare_set(pd_store *s, const char *key,
                               const void *expected, size_t expected_len,
                               const void *desired, size_t desired_len,
                               uint8_t **out, size_t *out_len);
pd_status pd_store_wait(pd_store *s, const char *const *keys, size_t nkeys,
                        double timeout);
pd_status pd_store_check(pd_store *s, const char *const *keys, size_t nkeys,
                         int *out);
pd_status pd_store_delete_key(pd_store *s, const char *key, int *deleted);
pd_status pd_store_num_keys(pd_store *s, int64_t *out);
pd_status pd_store_append(pd_store *s, const char *key, const void *val,
                          size_t n);
/* *keys: free with pd_store_free_keys(*keys, *n). */
pd_status pd_store_list_keys(pd_store *s, char ***keys, size_t *n);
void pd_store_set_timeout(pd_store *s, double timeout);
double pd_store_timeout(const pd_store *s);
/* Accepts NULL. */
void pd_store_destroy(pd_store *s);

/* Sets the standard timeout message: "wait timeout after <ms>ms, keys:
 * <prefix><key>, ..." and returns PD_ESTORE. */
pd_status pd_store_timeout_error(const char *key_prefix, double timeout,
                                 const char *const *keys, size_t nkeys);

/* Copies of keys[0..n) with prefix (plen bytes) in front, for stores that
 * namespace user keys; NULL (PD_ENOMEM set) on failure.  Free with
 * pd_store_free_keys. */
char **pd_store_prefix_keys(const char *prefix, size_t plen,
                            const char *const *keys, size_t n);
void pd_store_free_keys(char **ks, size_t n);

/* ---------------------------------------------------------------- HashStore */
pd_status pd_hash_store_new(double timeout, pd_store **out);

/* ---------------------------------------------------------------- FileStore */
/* Records appended to one file under flock(); processes sharing the path
 * share the keys.  world_size >= 0: the last of world_size users to close it
 * deletes the file (torch's rule); -1: never deleted. */
pd_status pd_file_store_new(const char *path, int world_size, double timeout,
                            pd_store **out);
/* The path of a FileStore (NULL for other stores). */
const char *pd_file_store_path(const pd_store *s);

/* ------------------------------------------------------------ TCPStore */
typedef struct pd_tcp_store_opts {
    const char *host;     /* server host for clients (the master too) */
    int port;             /* 0 on the master: pick a free port */
    int world_size;       /* < 0: unknown, do not wait for workers */
    int is_master;        /* start the server thread in this process */
    double timeout;       /* seconds; connect, requests and default waits */
    int wait_for_workers; /* add 1 to "init/"; the master waits for all */
    const char *secret;   /* NULL or "": no secret, magic word only */
    int listen_fd;        /* master only: adopt this listening socket; -1 */
    const char *bind_host; /* master only: listen on this address; NULL or
                            * "": every interface */
} pd_tcp_store_opts;

void pd_tcp_store_opts_init(pd_tcp_store_opts *o);
pd_status pd_tcp_store_new(const pd_tcp_store_opts *o, pd_store **out);
/* Port of the server (the bound one on the master); -1 for other stores. */
int pd_tcp_store_port(const pd_store *s);
const char *pd_tcp_store_host(const pd_store *s);
/* Numeric local IP of the client's connection to the server. */
pd_status pd_tcp_store_local_addr(pd_store *s, char *buf, size_t len);
/* Round trip to the server. */
pd_status pd_tcp_store_ping(pd_store *s);
/* A will: when this client's connection closes (the process exits or dies),
 * the server sets key to val, waking whoever waits for key.  on 0 drops the
 * will on key (val unused).  A connection may hold several wills. */
pd_status pd_tcp_store_will(pd_store *s, const char *key, const void *val,
                            size_t n, int on);

/* The server alone: an event loop on one thread serving many clients.
 * port 0 picks a free port; listen_fd >= 0 adopts a listening socket
 * (closed by pd_tcp_server_stop).  Listens on bind_host, or on all IPv4
 * interfaces when it is NULL or "". */
typedef struct pd_tcp_server pd_tcp_server;
pd_status pd_tcp_server_start(const char *bind_host, int port, int listen_fd,
                              const char *secret,
                              pd_tcp_server **out);
int pd_tcp_server_port(const pd_tcp_server *srv);
/* Append to this thread's error message the clients the server refused for
 * their secret (nothing when none); keeps and returns st. */
pd_status pd_tcp_server_explain_refusals(pd_tcp_server *srv, pd_status st);
/* Stops the thread, closes every socket, frees everything.  Accepts NULL. */
void pd_tcp_server_stop(pd_tcp_server *srv);

#endif
