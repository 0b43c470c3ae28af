/* Declarations the files of core/ share (the modes need none of them). A run (lifecycle.c) over a group of
 * streams (group.c): validate.c -> files.c -> the mode's setup -> net.c -> stream.c (each stream's timed
 * transfer; several on one thread: mux.c) -> totals.c.
 */
#ifndef ZC_CORE_H
#define ZC_CORE_H

#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>

#include "zc_internal.h"

/* validate.c: the parameter table's range checks and the mode's; picks c->ops */
int zc_validate_ctx(zc_ctx *c, int side);

/* files.c: the source; the sink (stream 0 prepares it as --sink-state says, the others reopen `first`'s) */
int zc_open_source(zc_ctx *c);
int zc_open_sink(zc_ctx *c);
int zc_reopen_sink(zc_ctx *c, const zc_ctx *first);

/* net.c: connection set-up and the untimed exchanges around the transfer */
int zc_poll_deadline(zc_ctx *c, int fd, short events, const char *doing);
int zc_listen(zc_ctx *c, int backlog, int *port);
int zc_connect(zc_ctx *c);
void zc_read_sock_info(zc_ctx *c);
void zc_read_tcp_info(zc_ctx *c);
#define ZC_HELLO_LEN 48
#define ZC_NONCE_LEN 16
/* --nonce (NULL or "": zeros) as bytes; -1 when it is not 2*ZC_NONCE_LEN hexadecimal digits */
int zc_nonce_bytes(const char *hex, unsigned char *out);
int zc_send_hello(zc_ctx *c);
/* one hello read from fd until deadline_ns (CLOCK_MONOTONIC): 0, or -1 with why (a static text) */
int zc_read_hello(int fd, unsigned char *b, int64_t deadline_ns, const char **why);
/* a hello's fields: magic checked (-1 if it is none), stream index, count, slice offset and length, nonce */
int zc_parse_hello(const unsigned char *b, uint32_t *idx, uint32_t *cnt, uint64_t *off, uint64_t *len,
                   const unsigned char **nonce);
int zc_await_receiver_close(zc_ctx *c);
int zc_expect_eof(zc_ctx *c);

/* stream.c: one stream's context, its pinning, its timed region and its ending */
void zc_ctx_init(zc_ctx *c, const zc_params *p, zc_error *err);
void zc_ctx_cleanup(zc_ctx *c);
int zc_pin_cpu(zc_ctx *c, int thread);   /* the calling thread, as thread `thread` of the group */
int zc_stream_transfer(zc_ctx *c);   /* timed region + the side's checks after it (in the stream's thread) */
void zc_stream_slice(uint64_t total, int n, int i, uint64_t *off, uint64_t *len);

/* group.c: the streams of one run */
typedef struct zc_group {
    int n;
    int nthreads;            /* zc_threads_effective: stream i runs on thread i % nthreads */
    zc_ctx *ctx;             /* n contexts; ctx[0] holds the listener (receiver) and the group */
    zc_params *params;       /* each stream's copy of the parameters */
    zc_error *errs;          /* each stream's error */
    int *rc;
    int64_t *tfail;          /* when each failed stream failed: the first failure explains the others */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;                  /* 1: start; -1: abort (a thread could not be created) */
    struct sockaddr_storage peers[8]; /* recv --peer resolved: the only addresses a connection may come from */
    int npeers;              /* 0: --peer not given (any address) */
} zc_group;

zc_group *zc_group_new(const zc_params *p, zc_error *err);
void zc_group_free(zc_group *g);
/* The error of the stream that failed first into err (0 if none failed). */
int zc_group_error(zc_group *g, zc_error *err);
/* Run every stream's transfer in threads of its own behind one gate; the group's span in t0, t1. */
void zc_group_run(zc_group *g, int64_t *t0, int64_t *t1);

/* mux.c: the streams idx[0..n) of g sharing the calling thread. prepare (untimed): their fibers, nonblocking
 * sockets, the epoll; 0, or -1 with the failing stream's err (*m is set either way: free it). run: each
 * stream's zc_stream_transfer into g->rc / g->tfail. */
typedef struct zc_mux zc_mux;
int zc_mux_prepare(zc_mux **m, zc_group *g, const int *idx, int n);
void zc_mux_run(zc_mux *m);
void zc_mux_free(zc_mux *m);
/* on = 1 at the start of the stream's timed region, 0 at its end: its share of its thread's CPU time, into c->m */
void zc_fiber_counting(zc_ctx *c, int on);
/* stream.c: add the RUSAGE_THREAD deltas from `a` to `b` to m's utime, stime, faults and switches */
void zc_rusage_add(zc_metrics *m, const struct rusage *a, const struct rusage *b);

/* totals.c: the group's metrics from its streams' (Metric.combine), and the per-stream copies */
void zc_group_totals(const zc_group *g, zc_metrics *m, int64_t wall_ns);
void zc_group_stream_metrics(const zc_group *g, const zc_params *p);

#endif
