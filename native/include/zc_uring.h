/* A minimal io_uring ring on the raw system calls (io_uring_setup/enter/register), shared by the
 * io_uring modes (send io_uring, io_uring_zc; recv io_uring). No liburing: see docs/architecture.md
 * "io_uring without liburing" for why. Built only when native/build.py found a usable
 * <linux/io_uring.h> (ZC_HAVE_IO_URING); a mode without it compiles to a stub whose probe says so.
 *
 * One ring per stream, used by one thread. Waiting honours the transfer deadline: every wait is a
 * timed io_uring_enter (IORING_ENTER_EXT_ARG) of at most 250 ms, after which the caller checks it; a
 * stream sharing its thread with others waits for its ring's fd with the thread's epoll (core/mux.c).
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

/* Create a ring of `entries` SQEs (CQ twice that, or cq_entries when not 0), disabled
 * (IORING_SETUP_R_DISABLED) until zc_uring_enable() so registrations can happen in one thread and
 * the transfer in another; with SINGLE_ISSUER + DEFER_TASKRUN where the kernel has them (else
 * without). 0, or -errno with the failing step in *what. */
int zc_uring_init(zc_uring *r, unsigned entries, unsigned cq_entries, const char **what);
/* The same for a stream sharing its thread (zc_ctx.shared): a ring waited for with epoll on its fd, so
 * neither DEFER_TASKRUN nor COOP_TASKRUN (completions would then wait for the next io_uring_enter, and
 * the fd would not turn readable while the thread sleeps in epoll_wait). */
int zc_uring_init_for(struct zc_ctx *c, zc_uring *r, unsigned entries, unsigned cq_entries, const char **what);
/* Submit what was handed out and wait (within the deadline) for completions: a stream alone on its
 * thread waits in io_uring_enter for at most one slice (250 ms); one sharing its thread submits, and
 * when no completion is there yet lets the thread's other streams run until the ring's fd is readable.
 * 0 (look at the CQ ring: it may be empty after a slice), or -1 with c->err filled. */
int zc_uring_wait(struct zc_ctx *c, zc_uring *r, const char *doing);
void zc_uring_exit(zc_uring *r);
/* IORING_REGISTER_ENABLE_RINGS: the calling thread becomes the ring's submitter. */
int zc_uring_enable(zc_uring *r);
/* io_uring_register(2): result, or -errno */
int zc_uring_register(zc_uring *r, unsigned opcode, void *arg, unsigned nr_args);

/* A zeroed SQE, or NULL when the submission queue is full (submit first). */
struct io_uring_sqe *zc_uring_get_sqe(zc_uring *r);
/* Submit what was handed out and wait until at least `wait_nr` CQEs are there or `timeout_ns`
 * passed (0 = do not wait). Returns the number submitted, -ETIME on timeout (not an error), or
 * -errno. EINTR is retried internally. */
int zc_uring_submit_wait(zc_uring *r, unsigned wait_nr, int64_t timeout_ns);
/* The next CQE, NULL when none; zc_uring_cqe_seen() consumes it. */
struct io_uring_cqe *zc_uring_peek(zc_uring *r);
void zc_uring_cqe_seen(zc_uring *r);

/* Which of `ops` (IORING_OP_*) the kernel supports, by IORING_REGISTER_PROBE: returns the first
 * unsupported opcode, -1 when all are, or -2 when the probe itself failed. */
int zc_uring_first_unsupported(zc_uring *r, const int *ops, int n);

/* Probe a ring for a mode's available(): a small ring, or 0 with a reason naming the cause
 * (ENOSYS: no io_uring in the kernel; EPERM: kernel.io_uring_disabled or a seccomp filter). */
int zc_uring_probe_ring(zc_uring *r, char *why, size_t len);
/* Whether an SQE prepared by `prep` (on a non-socket file: the ring's own fd) passes the kernel's
 * preparation: 1 = flags accepted (the kernel then fails the issue with ENOTSOCK), 0 = refused
 * (EINVAL: the kernel does not know a flag), -errno when the probe could not be run. */
int zc_uring_flags_accepted(zc_uring *r, void (*prep)(struct io_uring_sqe *sqe, int fd));

/* The send loop both io_uring send modes share (core/uring_send.c): `zc` = IORING_OP_SEND_ZC from
 * registered buffers with notifications (io_uring_zc), else IORING_OP_SEND (io_uring). */
int zc_uring_send_setup(struct zc_ctx *c, int zc);
int zc_uring_send_connected(struct zc_ctx *c);
int zc_uring_send_transfer(struct zc_ctx *c);
void zc_uring_send_teardown(struct zc_ctx *c);

#endif /* ZC_HAVE_IO_URING */

#endif
