/* Declarations shared by the core and the mode files: each mode file (send_*.c, recv_*.c) fills one
 * zc_mode_ops table (registry.c lists them); setup() runs untimed before the connection exists, transfer()
 * is the timed loop, teardown() frees.
 */
#ifndef ZC_INTERNAL_H
#define ZC_INTERNAL_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <sys/types.h>
#include <sys/stat.h>

#include "zcorch_api.h"
#include "zc_params_gen.h"   /* zc_params, zc_metrics and their tables, generated from zcorch/params.py */

struct zc_ctx;

#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Filled with designated initializers; .name, .side, .caps and .transfer are required */
typedef struct zc_mode_ops {
    const char *name;
    int side;                                /* ZC_SIDE_SEND / ZC_SIDE_RECV */
    unsigned caps;                           /* ZC_CAP_* (zcorch_api.h); validate.c and setup() refuse what they exclude */
    /* optional, for ZC_CAP_KERNEL_FEATURE: 1 if this kernel can run the mode, else 0 with why filled */
    int (*available)(char *why, size_t len);
    int (*setup)(struct zc_ctx *c);          /* optional: untimed; 0 or zc_fail() */
    int (*transfer)(struct zc_ctx *c);       /* timed; moves c->total bytes (or until EOF) */
    void (*teardown)(struct zc_ctx *c);      /* optional: called once setup was attempted */
    int (*connected)(struct zc_ctx *c);      /* optional: untimed, once c->sock is connected; 0 or zc_fail() */
} zc_mode_ops;

typedef struct zc_ctx {
    const zc_params *p;
    const zc_mode_ops *ops;
    zc_error *err;
    zc_metrics m;

    int sock;                /* the connected data socket */
    int listen_fd;
    int fd;                  /* source (send) or sink (recv) file, -1 for source mem */
    int fd_is_reg;           /* the file is a regular file (seekable, mmap-able, has a size) */
    int src_mem;             /* send: source "mem" */
    int src_zero;            /* send: source is /dev/zero */
    uint64_t orig_size;      /* recv: sink size after the sink-state preparation */
    uint64_t total;          /* bytes to move (send always, recv when --bytes is set) */
    int total_known;
    uint64_t done;           /* bytes moved so far */
    size_t buffer;           /* bytes per chunk */
    size_t sub;              /* bytes per sub-block call: ceil(buffer / subblocks) */
    size_t page;
    int pipe[2];             /* -1 when the mode uses no pipe */
    size_t pipe_cap;         /* effective pipe capacity */
    int64_t deadline_ns;     /* CLOCK_MONOTONIC */
    uint64_t seen_done;      /* c->done when zc_check_deadline last saw it change, and when (CLOCK_MONOTONIC): */
    int64_t progress_ns;     /* a timeout says whether data was still moving or had stopped */
    int64_t end_ns;          /* send --duration: when the sender stops (0: move c->total bytes) */
    int64_t timeo_ns;        /* current SO_SNDTIMEO/SO_RCVTIMEO on c->sock */
    unsigned char *mem_ring; /* source mem: pattern of one period + one buffer, never rewritten */
    size_t mem_ring_len;
    int mem_ring_borrowed;   /* the ring is stream 0's (shared by the group; freed with stream 0) */
    void *priv;              /* mode-private state */
    uint64_t base;           /* where this stream's slice of the source/sink starts (group.c) */
    int stream, nstreams;
    struct zc_group *group;
    int64_t t0_ns, t1_ns;    /* this stream's timed region (CLOCK_MONOTONIC; 0 = not run) */
    int listen_maxseg;       /* recv: TCP_MAXSEG a mode's setup() wants on the listening socket (0: none) */
    struct zc_watch_state *watch_state; /* hoststat.c: zc_params.watch while the transfer runs */
    int shared;              /* the stream shares its thread (known before setup: for io_uring rings) */
    struct zc_fiber *fiber;  /* mux.c: set while it runs on a shared thread */
} zc_ctx;

/* hoststat.c: host counters and samples (zc_params.watch) around the timed region; no-ops without a
 * watch. zc_watch_end is called once after every zc_watch_begin, whatever the transfer's outcome. */
void zc_watch_begin(zc_ctx *c);
void zc_watch_end(zc_ctx *c);
/* group.c: the streams of c's group (one stream is a group of one) */
int zc_group_size(const zc_ctx *c);
const zc_ctx *zc_group_stream(const zc_ctx *c, int i);

/* registry.c */
const zc_mode_ops *zc_find_mode(int side, const char *name);
/* The modes of either side declaring `cap`, sorted, each once, "a/b" in buf (the cell rules' "only ..."). */
const char *zc_modes_with(unsigned cap, char *buf, size_t len);
/* why the first missing build feature ("io_uring", ...) of a NULL-terminated list is missing, else NULL */
const char *zc_build_missing_any(const char *const *features);

/* The ops of a mode this build lacks a feature for (`...`: the native/build.py FEATURES it needs): listed with
 * the first missing one's reason, refused if run. One per mode file, in its #else branch. */
#define ZC_UNBUILT_MODE(ops, mode_name, mode_side, mode_caps, ...)                                           \
    static const char *const unbuilt_features_[] = {__VA_ARGS__, NULL};                                   \
    static int unbuilt_available_(char *why, size_t len)                                                  \
    {                                                                                                     \
        snprintf(why, len, "%s", zc_build_missing_any(unbuilt_features_));                               \
        return 0;                                                                                         \
    }                                                                                                     \
    static int unbuilt_refuse_(zc_ctx *c)                                                                 \
    {                                                                                                     \
        return zc_fail(c, EOPNOTSUPP, "%s", zc_build_missing_any(unbuilt_features_));                    \
    }                                                                                                     \
    const zc_mode_ops ops = {.name = (mode_name), .side = (mode_side), .caps = (mode_caps),              \
                             .available = unbuilt_available_, .setup = unbuilt_refuse_,                  \
                             .transfer = unbuilt_refuse_}

/* openpath.c: zc_open_file with the fstat of what it opened */
int zc_open_path(const char *path, int how, struct stat *st, int *created, zc_error *err);

/* errors (common.c): fill c->err with "<side> <mode>: <fmt>", return -1 */
int zc_fail(zc_ctx *c, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* same with ": strerror(errno)" appended and code = errno */
int zc_fail_errno(zc_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* time and deadline (common.c) */
int64_t zc_now_ns(void);
int zc_check_deadline(zc_ctx *c, const char *doing);   /* ETIMEDOUT once past the deadline */
/* The top of every send mode's chunk loop, the one place --duration acts: 1 = send another chunk, 0 = done
 * (c->total bytes moved, or the duration is up: c->total becomes c->done), -1 = failed (deadline) */
int zc_send_more(zc_ctx *c);
/* After a call on the data socket returned -1: 1 = call it again (EINTR, or EAGAIN from the socket timeout
 * with the deadline not reached: timeout re-armed); -1 = failed (deadline passed; or another error with
 * `failed` given: "<failed>: strerror"); 0 = another error with `failed` NULL (errno intact). */
int zc_io_retry(zc_ctx *c, const char *doing, const char *failed);
int zc_set_sock_timeouts(zc_ctx *c);
/* The one way a mode waits for anything but its own socket call: until fd has one of `events` (POLLIN/POLLOUT;
 * POLLERR and POLLHUP always count), within the deadline (a stream sharing its thread lets the others run):
 * the revents seen, 0 when one slice passed without them (call again), -1 failed (c->err). */
int zc_wait_fd(zc_ctx *c, int fd, short events, const char *doing);
/* mux.c, for a stream sharing its thread (c->fiber): park until fd reports `events` after a call on it just said
 * EAGAIN (an edge after that call wakes it); give way after one buffer's bytes (zc_check_deadline calls it) */
int zc_fiber_wait(zc_ctx *c, int fd, short events, const char *doing);
void zc_fiber_share(zc_ctx *c);

/* pipes and buffers (common.c) */
int zc_open_pipe(zc_ctx *c, size_t unit);    /* auto size: at least `unit`, the bytes of one vmsplice/splice call */
void *zc_alloc(zc_ctx *c, size_t len, const char *what);     /* page-aligned anonymous mapping */
long zc_read_sysctl(const char *path, long dflt);            /* the number in a /proc/sys file, else dflt */
void zc_free(void *p, size_t len);
/* the mode's private state: zeroed, stored in c->priv, freed by the mode's teardown */
static inline void *zc_priv_new(zc_ctx *c, size_t len)
{
    return c->priv = zc_alloc(c, len, "state");
}
/* The private state of a mode needing only one buffer of c->buffer bytes: new (0, or -1), free (teardown) */
typedef struct {
    unsigned char *buf;
} zc_buf_state;
int zc_buf_state_new(zc_ctx *c, const char *what);
void zc_buf_state_free(zc_ctx *c);
int zc_mem_ring_init(zc_ctx *c);
/* The pattern at stream offset `off` of this stream's slice (base + off of the whole transfer) */
static inline const unsigned char *zc_mem_at(const zc_ctx *c, uint64_t off)
{
    return c->mem_ring + ((c->base + off) % zc_mem_pattern_period());
}
/* Write the pattern at stream offset `off` into dst anew (len <= buffer): a copy out of the ring (the
 * stores of the splice-write-benchmark's memset; the loads hit the cache) */
static inline void zc_mem_fill(const zc_ctx *c, unsigned char *dst, uint64_t off, size_t len)
{
    memcpy(dst, zc_mem_at(c, off), len);
}
/* --fill rand_crc32 (fill.c): dst gets the message at stream offset `off`, a seeded PRNG stream, and its crc32 */
void zc_fill_rand_crc32(const zc_ctx *c, unsigned char *dst, uint64_t off, size_t len);
/* --refill: write the message at stream offset `off` anew into dst, as --fill says */
static inline void zc_refill(const zc_ctx *c, unsigned char *dst, uint64_t off, size_t len)
{
    if (c->p->fill == ZC_FILL_RAND_CRC32)
        zc_fill_rand_crc32(c, dst, off, len);
    else
        zc_mem_fill(c, dst, off, len);
}

/* I/O loops that honour the deadline (common.c) */
int zc_sock_write_all(zc_ctx *c, const void *buf, size_t len);
ssize_t zc_sock_read(zc_ctx *c, void *buf, size_t len);             /* >0, 0 = EOF, -1 = failed */
int zc_file_read_full(zc_ctx *c, void *buf, size_t len);            /* source ended early = error */
int zc_file_write_all(zc_ctx *c, const void *buf, size_t len);      /* sink */
int zc_splice_all(zc_ctx *c, int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                  unsigned flags, const char *what);                 /* moves exactly len */
int zc_vmsplice_out(zc_ctx *c, const unsigned char *buf, size_t len, int out, loff_t *off_out);
struct iovec;
/* vmsplice() the iovecs into the pipe (as many as it holds, IOV_MAX at most; advanced) and splice() on to `out` */
int zc_vmsplice_iov_out(zc_ctx *c, struct iovec *iov, size_t n, int out, loff_t *off_out);

/* --bytes given (0 is the table's "unset": send the source's size, receive until EOF) */
static inline int zc_bytes_set(const zc_params *p) { return p->bytes != 0; }
/* --duration given (0 is unset): the sender sends until the time is up, the receiver reads until EOF */
static inline int zc_duration_set(const zc_params *p) { return p->duration > 0; }
/* c->total of a sender with --duration: more than any run moves, small enough that base + done never overflows */
#define ZC_UNTIL_TIME_BYTES (UINT64_C(1) << 62)
static inline size_t zc_min(size_t a, uint64_t b) { return (uint64_t)a < b ? a : (size_t)b; }
/* bytes the receiver may still ask for: a whole `want` when reading until EOF */
static inline size_t zc_recv_want(const zc_ctx *c, size_t want)
{
    return c->total_known ? zc_min(want, c->total - c->done) : want;
}

#endif
