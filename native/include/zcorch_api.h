/* Public API of the zcorch native transfer core, fed verbatim to cffi's ffi.cdef() (native/build.py): no
 * include guards, #include or function-like macros. Every function returns 0, or -1 with *err filled (code =
 * an errno value, message = "<side> <mode>: <what failed>: <reason>"); nothing here prints or exits.
 */

#define ZC_SIDE_SEND 0
#define ZC_SIDE_RECV 1

typedef struct zc_error {
    int code;                  /* errno value (EINVAL, ETIMEDOUT, EPIPE, EOPNOTSUPP, ...) */
    char message[512];
} zc_error;

/* Host-wide counters and per-interval samples taken around the timed region (hoststat.c). The caller
 * owns every buffer; NULL / 0 switches a part off. Files of a snapshot, in this order: /proc/stat,
 * /proc/softirqs, /proc/net/snmp, /proc/vmstat. */
#define ZC_HOST_NFILES 4

typedef struct zc_host_snap {
    char *buf;                 /* the caller's buffer for the files' texts (NULL: no snapshot) */
    size_t cap;
    size_t off[4];             /* where each file's text starts in buf (files in the order above) */
    size_t len[4];             /* its length (0 with err set: unreadable) */
    int err[4];                /* errno of a file that could not be read whole (ENOBUFS: buf too small), else 0 */
    int64_t at_ns;             /* CLOCK_MONOTONIC right after /proc/stat was read */
} zc_host_snap;

typedef struct zc_sample {
    int64_t t_ns;              /* since the start of the timed region */
    uint64_t bytes;            /* bytes moved so far */
    int64_t proc_cpu_ns;       /* CPU time of the worker process since the start (all its threads) */
    int64_t host_busy_ticks;   /* /proc/stat "cpu" since the start: user+nice+system+irq+softirq */
    int64_t host_softirq_ticks;
    int64_t host_idle_ticks;   /* idle + iowait */
    int64_t tcp_snd_cwnd;      /* TCP_INFO at the sample */
    int64_t tcp_rtt_us;
    int64_t tcp_total_retrans;
} zc_sample;

typedef struct zc_watch {
    zc_host_snap before;       /* read just before the timed region (/proc/stat last) */
    zc_host_snap after;        /* read just after it (/proc/stat first) */
    double interval_s;         /* > 0: a sampler thread records one zc_sample per interval */
    zc_sample *samples;        /* the caller's array of samples_cap entries */
    size_t samples_cap;
    size_t n_samples;          /* samples written (the last one at the end of the transfer) */
    int samples_dropped;       /* 1 when samples_cap was too small for the run */
    int sampler_err;           /* errno when the sampler could not run (the transfer ran without it) */
} zc_watch;

/* One side's parameters and result, generated from zcorch/params.py into zc_params_gen.h (cdef'd after this
 * file): a field per worker parameter, named as its flag (--pipe-size -> pipe_size), a value or "unset". */
typedef struct zc_params zc_params;
typedef struct zc_metrics zc_metrics;

typedef struct zc_listener {
    int port;                  /* the port actually bound (useful with port 0) */
    void *state;               /* the receiver's context; freed by zc_recv_run or zc_listener_close */
    int refused;               /* out: data connections dropped (not from --peer, no hello with the nonce) */
    char refused_text[512];    /* out: the first of them, "ADDR: why" separated by "; " */
} zc_listener;

int zc_mode_count(int side);
const char *zc_mode_name(int side, int index);

/* Capabilities a mode declares (zc_mode_ops.caps). Planning derives which cells can run from them;
 * the mode's setup() still refuses what it cannot do. Each bit has a stable name (zc_cap_name). */
#define ZC_CAP_FILE_SOURCE     0x01  /* "file_source": send needs a file descriptor, not source mem */
#define ZC_CAP_MAPPABLE_SOURCE 0x02  /* "mappable_source": send needs a regular file to mmap (not /dev/zero) */
#define ZC_CAP_FILE_SINK       0x04  /* "file_sink": recv needs a regular-file sink (not /dev/null) */
#define ZC_CAP_PIPE            0x08  /* "pipe": moves data through a pipe, so --pipe-size applies */
#define ZC_CAP_GIFT            0x10  /* "gift": honours --gift (SPLICE_F_GIFT on vmsplice) */
#define ZC_CAP_ZC_COMPLETIONS  0x20  /* "zc_completions": reports the zc_* metrics */
#define ZC_CAP_KERNEL_FEATURE  0x40  /* "kernel_feature": needs a kernel feature, probed by zc_mode_available */
#define ZC_CAP_NO_SINK         0x80  /* "no_sink": recv keeps no data, so its sink must be /dev/null */
#define ZC_CAP_ZC_RECV         0x100 /* "zc_recv": reports zc_recv_mapped / zc_recv_copied */
#define ZC_CAP_URING           0x200 /* "uring": an io_uring mode: honours --uring-depth, reports uring_* */
#define ZC_CAP_ONE_STREAM      0x400 /* "one_stream": cannot run as parallel streams (--streams > 1 refused) */
#define ZC_CAP_GRAIN           0x800 /* "grain": honours --mmap-grain and --splice-grain (the calls per buffer) */
#define ZC_CAP_REFILL          0x1000 /* "refill": honours --refill/--fill (each sub-block written anew before it is sent) */
#define ZC_CAP_ALL             0x1fff

/* ZC_CAP_* bits of a compiled mode; 0 for an unknown one (check zc_mode_name first). */
unsigned zc_mode_caps(int side, const char *name);
/* Stable name of one ZC_CAP_* bit, NULL for anything else. */
const char *zc_cap_name(unsigned bit);
/* Whether a compiled mode can run on this kernel (probed, no side effect left): 1; 0 with why; -1 unknown mode */
int zc_mode_available(int side, const char *name, char *why, size_t len);

/* What the build found on the host (native/build.py FEATURES: io_uring, io_uring_send_zc, ...):
 * the name of feature i (NULL past the last), and NULL if this build has it, else why not. */
const char *zc_build_feature_name(int index);
const char *zc_build_feature_missing(int index);

/* Open a source or a sink (openpath.c) following no link, judged on the descriptor: a regular file on a data
 * filesystem, or /dev/null (and for a source /dev/zero, /dev/urandom; ZC_OPEN_DEVICES: any device).
 * ZC_OPEN_CREATE: create a missing sink (*created = 1); ZC_OPEN_WALK: one component at a time, as without
 * openat2 (tests). The descriptor (O_CLOEXEC, never truncated), or -1 with *err filled. */
#define ZC_OPEN_SOURCE  0
#define ZC_OPEN_SINK    1
#define ZC_OPEN_DEVICES 4
#define ZC_OPEN_CREATE  8
#define ZC_OPEN_WALK    16
int zc_open_file(const char *path, int how, int *created, zc_error *err);
/* Open directory `path` (absolute; the worker's `layout`) as zc_open_file does, judged to be on a data filesystem;
 * `how`: ZC_OPEN_WALK or 0. An O_PATH descriptor for the *at calls, or -1 with *err filled. */
int zc_open_dir(const char *path, int how, zc_error *err);

/* Fixed pattern of source "mem" (see mempattern.c): byte at stream offset off. */
void zc_mem_pattern(uint64_t off, unsigned char *out, size_t len);
uint64_t zc_mem_pattern_period(void);

/* Receiver, in two steps so the caller can announce the port in between: zc_recv_listen (untimed: validate,
 * the sink, the mode's setup, listen); zc_recv_run (accept, the timed transfer; always consumes the listener).
 * zc_listener_close releases a listener never run. */
int zc_recv_listen(const zc_params *p, zc_listener *out, zc_error *err);
int zc_recv_run(const zc_params *p, zc_listener *l, zc_metrics *m, zc_error *err);
void zc_listener_close(zc_listener *l);

/* Sender: validate, open the source, connect, run. */
int zc_send_run(const zc_params *p, zc_metrics *m, zc_error *err);

/* The table's defaults (every parameter field; the others zero: no host, no watch). */
void zc_params_init(zc_params *p);
/* The threads a side runs its streams on, never more than --streams: --threads, or (0) one per CPU of --cpus,
 * one with --cpu, else one per stream up to the CPUs this process may use. The one place it is resolved. */
int zc_threads_effective(const zc_params *p);
/* The checks zc_send_run / zc_recv_listen start with (limits, mode, cell rules), nothing else: 0, or -1 */
int zc_validate(const zc_params *p, zc_error *err);

/* Copy-cost calibration of this host (calibrate.c) on the calling thread, pinned to cpu unless -1: memcpy,
 * first-touch page faults and a trivial system call, medians over rounds. */
typedef struct zc_calibration {
    uint64_t memcpy_bytes;     /* bytes copied per round */
    int64_t memcpy_rounds;
    int64_t memcpy_ns;         /* median time of one round */
    int64_t memcpy_best_ns;    /* fastest round */
    uint64_t fault_pages;      /* fresh pages touched per round */
    int64_t fault_ns;          /* median time to touch them all */
    int64_t fault_minflt;      /* minor faults counted during that round (about fault_pages) */
    int64_t page_size;
    uint64_t syscall_calls;    /* calls per round */
    int64_t syscall_ns;        /* median time of one round */
} zc_calibration;

int zc_calibrate(uint64_t bytes, int cpu, zc_calibration *out, zc_error *err);
