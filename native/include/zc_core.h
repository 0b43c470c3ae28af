/* Declarations the files of the transfer core share (the files of core/; the modes need none of them).
 *
 * One run is one lifecycle (lifecycle.c) over a group of streams (group.c), one stream being a group of
 * one: validate (validate.c) -> open the source or sink (files.c) -> the mode's setup -> connect or
 * listen and accept (net.c) -> the timed transfer of every stream (stream.c) -> the group's totals
 * (totals.c). Per-stream state is the zc_ctx; what a thread does is group.c's: today one thread runs
 * one stream, and nothing but group.c assumes so (a later change may run several streams per thread).
 */
#ifndef ZC_CORE_H
#define ZC_CORE_H

#include <pthread.h>

#include "zc_internal.h"

/* validate.c: the parameter table's range checks and the mode's; picks c->ops */
int zc_validate_ctx(zc_ctx *c, int side);

/* files.c: the sender's source, the receiver's sink (prepared as --sink-state says; stream 0 prepares,
 * the others open it again with the prepared state of `first`) */
int zc_open_source(zc_ctx *c);
int zc_open_sink(zc_ctx *c);
int zc_reopen_sink(zc_ctx *c, const zc_ctx *first);

/* net.c: connection set-up and the untimed exchanges around the transfer */
int zc_poll_deadline(zc_ctx *c, int fd, short events, const char *doing);
int zc_listen(zc_ctx *c, int backlog, int *port);
int zc_connect(zc_ctx *c);
void zc_read_sock_info(zc_ctx *c);
void zc_read_tcp_info(zc_ctx *c);
#define ZC_HELLO_LEN 32
int zc_send_hello(zc_ctx *c);
int zc_read_hello(zc_ctx *c, int fd, unsigned char *b);
/* a hello's fields: magic checked (-1 if it is none), stream index, count, slice offset and length */
int zc_parse_hello(const unsigned char *b, uint32_t *idx, uint32_t *cnt, uint64_t *off, uint64_t *len);
int zc_await_receiver_close(zc_ctx *c);
int zc_expect_eof(zc_ctx *c);

/* stream.c: one stream's context, its pinning, its timed region and its ending */
void zc_ctx_init(zc_ctx *c, const zc_params *p, zc_error *err);
void zc_ctx_cleanup(zc_ctx *c);
int zc_pin_cpu(zc_ctx *c);
int zc_stream_transfer(zc_ctx *c);   /* timed region + the side's checks after it (in the stream's thread) */
void zc_stream_slice(uint64_t total, int n, int i, uint64_t *off, uint64_t *len);

/* group.c: the streams of one run */
typedef struct zc_group {
    int n;
    zc_ctx *ctx;             /* n contexts; ctx[0] holds the listener (receiver) and the group */
    zc_params *params;       /* each stream's copy of the parameters */
    zc_error *errs;          /* each stream's error */
    int *rc;
    int64_t *tfail;          /* when each failed stream failed: the first failure explains the others */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;                  /* 1: start; -1: abort (a thread could not be created) */
} zc_group;

zc_group *zc_group_new(const zc_params *p, zc_error *err);
void zc_group_free(zc_group *g);
/* The error of the stream that failed first into err (0 if none failed). */
int zc_group_error(zc_group *g, zc_error *err);
/* Run every stream's transfer in threads of its own behind one gate; the group's span in t0, t1. */
void zc_group_run(zc_group *g, int64_t *t0, int64_t *t1);

/* totals.c: the group's metrics from its streams' (Metric.combine), and the per-stream copies */
void zc_group_totals(const zc_group *g, zc_metrics *m, int64_t wall_ns);
void zc_group_stream_metrics(const zc_group *g, const zc_params *p);

#endif
