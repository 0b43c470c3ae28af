/* A minimal io_uring ring on the raw system calls, for the io_uring modes (no liburing: docs/architecture.md
 * "io_uring without liburing"). Only with ZC_HAVE_IO_URING (native/build.py). One ring per stream; every wait
 * is a timed io_uring_enter of at most 250 ms (the deadline checked in between), or, for a stream sharing its
 * thread, the thread's epoll on the ring's fd (core/mux.c).
 */
#ifndef ZC_URING_H
#define ZC_URING_H

#ifdef ZC_HAVE_IO_URING

#include <linux/io_uring.h>
#include <stddef.h>
#include <stdint.h>

typedef struct zc_uring {
    int fd;
    unsigned flags;                /* IORING_SETUP_* the ring was created with */
    unsigned features;             /* IORING_FEAT_* the kernel reported */
    unsigned sq_entries, cq_entries;
    unsigned *sq_head, *sq_tail, *sq_mask, *sq_array;
    unsigned *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
    unsigned sq_local_tail;        /* next SQE to hand out */
    unsigned to_submit;            /* SQEs handed out since the last enter */
    void *sq_map, *cq_map;
    size_t sq_map_len, cq_map_len, sqes_len;
} zc_uring;

/* A ring of `entries` SQEs (CQ twice that, or cq_entries when not 0), disabled (IORING_SETUP_R_DISABLED)
 * until zc_uring_enable() so registrations and the transfer can be in different threads; SINGLE_ISSUER +
 * DEFER_TASKRUN where the kernel has them, unless `polled` (a stream sharing its thread, zc_ctx.shared: its
 * fd must turn readable while the thread sleeps in epoll_wait). 0, or -errno with the failing step in *what. */
int zc_uring_init(zc_uring *r, unsigned entries, unsigned cq_entries, int polled, const char **what);
/* Submit what was handed out and wait, within the deadline, for completions (one slice at most): 0 (the CQ
 * ring may still be empty), or -1 with c->err filled. */
int zc_uring_wait(struct zc_ctx *c, zc_uring *r, const char *doing);
void zc_uring_exit(zc_uring *r);
/* IORING_REGISTER_ENABLE_RINGS: the calling thread becomes the ring's submitter. */
int zc_uring_enable(zc_uring *r);
/* io_uring_register(2): result, or -errno */
int zc_uring_register(zc_uring *r, unsigned opcode, void *arg, unsigned nr_args);

/* A zeroed SQE, or NULL when the submission queue is full (submit first). */
struct io_uring_sqe *zc_uring_get_sqe(zc_uring *r);
/* Submit and wait until `wait_nr` CQEs are there or `timeout_ns` passed (0: no wait): the number submitted,
 * -ETIME on timeout, or -errno. */
int zc_uring_submit_wait(zc_uring *r, unsigned wait_nr, int64_t timeout_ns);
/* The next CQE, NULL when none; zc_uring_cqe_seen() consumes it. */
struct io_uring_cqe *zc_uring_peek(zc_uring *r);
void zc_uring_cqe_seen(zc_uring *r);

/* By IORING_REGISTER_PROBE: the first of `ops` (IORING_OP_*) unsupported, -1 when none, -2: no probe */
int zc_uring_first_unsupported(zc_uring *r, const int *ops, int n);

/* For a mode's available(): 1 with a small ring in r, or 0 with why (no io_uring, io_uring_disabled, seccomp) */
int zc_uring_probe_ring(zc_uring *r, char *why, size_t len);
/* Whether an SQE prepared by `prep` on the ring's own fd passes the kernel's preparation: 1 = flags accepted
 * (the issue then fails with ENOTSOCK), 0 = refused (EINVAL: an unknown flag), -errno: no probe. */
int zc_uring_flags_accepted(zc_uring *r, void (*prep)(struct io_uring_sqe *sqe, int fd));

/* core/uring_send.c, the io_uring send modes' loop: `zc` = IORING_OP_SEND_ZC (io_uring_zc), else IORING_OP_SEND */
int zc_uring_send_setup(struct zc_ctx *c, int zc);
int zc_uring_send_connected(struct zc_ctx *c);
int zc_uring_send_transfer(struct zc_ctx *c);
void zc_uring_send_teardown(struct zc_ctx *c);

#endif /* ZC_HAVE_IO_URING */

#endif
