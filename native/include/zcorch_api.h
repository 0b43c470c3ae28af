/* Public API of the zcorch native transfer core.
 *
 * Declarations only: this file is fed verbatim to cffi's ffi.cdef() (native/build.py), so it must
 * stay free of include guards, #include and function-like macros. C sources include it through
 * zc_internal.h. Every function returns 0 on success or -1 with *err filled (code = an errno value,
 * message = "<side> <mode>: <what failed>: <reason>"); nothing here prints or exits.
 */

#define ZC_SIDE_SEND 0
#define ZC_SIDE_RECV 1

#define ZC_MSG_LEN 512

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

/* The parameters of one side's run (zc_params) and its result (zc_metrics): generated from the tables of
 * zcorch/params.py into zc_params_gen.h (native/gen_params.py), whose declarations cffi's cdef reads after
 * this file. A field per worker parameter (named as its flag: --pipe-size -> pipe_size), each a value or
 * the table's "unset" (0 for window: the kernel's); zc_params_init fills in the table's defaults. */
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
/* Whether a compiled mode can run on this kernel: 1 = yes; 0 = no, why says why (NUL-terminated,
 * at most len bytes); -1 = unknown mode. Probes the kernel, no side effect is left behind. */
int zc_mode_available(int side, const char *name, char *why, size_t len);

/* What the build found on the host (native/build.py FEATURES: io_uring, io_uring_send_zc, ...):
 * the name of feature i (NULL past the last), and NULL if this build has it, else why not. */
const char *zc_build_feature_name(int index);
const char *zc_build_feature_missing(int index);

/* Open a source or a sink (openpath.c): without following a link in any component of the path, judged on
 * the descriptor (a regular file on a data filesystem, or an allowed device: /dev/null, and for a source
 * /dev/zero and /dev/urandom; ZC_OPEN_DEVICES: any device, a sink the experiment's allow_destroy lists).
 * ZC_OPEN_CREATE: a missing sink is created (*created = 1). ZC_OPEN_WALK: resolve one component at a time
 * as on a kernel without openat2 (tests). Returns the descriptor (O_CLOEXEC; read-only for a source,
 * read-write for a sink, never truncated), or -1 with *err filled. */
#define ZC_OPEN_SOURCE  0
#define ZC_OPEN_SINK    1
#define ZC_OPEN_DEVICES 4
#define ZC_OPEN_CREATE  8
#define ZC_OPEN_WALK    16
int zc_open_file(const char *path, int how, int *created, zc_error *err);
/* Open directory `path` (absolute) to create files in it (the worker's `layout`): without following a link in
 * any component, as zc_open_file, and judged on the descriptor: a directory on a data filesystem. `how`:
 * ZC_OPEN_WALK or 0. Returns an O_PATH descriptor (O_CLOEXEC) for the dirfd of the *at calls, or -1 with
 * *err filled (ELOOP a link, ENOENT missing, EPERM a kernel interface or an unknown filesystem). */
int zc_open_dir(const char *path, int how, zc_error *err);

/* Fixed pattern of source "mem" (see mempattern.c): byte at stream offset off. */
void zc_mem_pattern(uint64_t off, unsigned char *out, size_t len);
uint64_t zc_mem_pattern_period(void);

/* Receiver, in two steps so the caller can announce the port in between:
 * zc_recv_listen validates, opens and prepares the sink, runs the mode's setup (all untimed), binds
 * and listens; zc_recv_run accepts within the deadline and runs the timed transfer. zc_recv_run
 * always consumes the listener; zc_listener_close releases one that is never run. */
int zc_recv_listen(const zc_params *p, zc_listener *out, zc_error *err);
int zc_recv_run(const zc_params *p, zc_listener *l, zc_metrics *m, zc_error *err);
void zc_listener_close(zc_listener *l);

/* Sender: validate, open the source, connect, run. */
int zc_send_run(const zc_params *p, zc_metrics *m, zc_error *err);

/* The table's defaults (every parameter field; the others zero: no host, no watch). */
void zc_params_init(zc_params *p);
/* The threads a side runs its streams on (--threads; 0 = auto: one per CPU of --cpus, one with --cpu,
 * else one per stream, never more than the CPUs this process may run on), never more than --streams:
 * the one place the default is resolved (the worker records the value in its params). */
int zc_threads_effective(const zc_params *p);
/* The checks zc_send_run / zc_recv_listen start with (the table's limits, the mode, what the mode
 * declares it cannot do), nothing else: 0, or -1 with err filled as those calls would. */
int zc_validate(const zc_params *p, zc_error *err);

/* Copy-cost calibration of this host (calibrate.c), on the calling thread (pinned to cpu unless -1):
 * memcpy of a `bytes` buffer in 64 KiB calls (larger than the caches: what one copy of streamed data
 * costs), first touch of fresh anonymous 4 KiB pages (a page fault plus zeroing each), and a trivial
 * system call (getppid). Times are medians over repetitions. */
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
