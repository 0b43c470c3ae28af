/* The run flow shared by every mode: validate, open the source/sink, connect or accept within the
 * deadline, time the mode's transfer loop (wall clock + RUSAGE_THREAD deltas taken immediately
 * around it), read TCP_INFO, and on the sender wait for the receiver's close so a result means the
 * receiver really got every byte. Everything untimed (allocation, sink preparation, connection
 * set-up, that final handshake) stays outside wall_ns.
 */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

static void ctx_init(zc_ctx *c, const zc_params *p, zc_error *err)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->err = err;
    c->sock = c->listen_fd = c->fd = -1;
    c->pipe[0] = c->pipe[1] = -1;
    c->page = (size_t)sysconf(_SC_PAGESIZE);
    err->code = 0;
    err->message[0] = '\0';
    double t = p->timeout_s > 0 ? p->timeout_s : 0;
    c->deadline_ns = zc_now_ns() + (int64_t)(t * 1e9);
}

static void ctx_cleanup(zc_ctx *c)
{
    if (c->ops && c->ops->teardown)
        c->ops->teardown(c);
    if (c->sock >= 0)
        close(c->sock);
    if (c->listen_fd >= 0)
        close(c->listen_fd);
    if (c->fd >= 0)
        close(c->fd);
    for (int i = 0; i < 2; i++)
        if (c->pipe[i] >= 0)
            close(c->pipe[i]);
    zc_free(c->mem_ring, c->mem_ring_len);
    c->sock = c->listen_fd = c->fd = c->pipe[0] = c->pipe[1] = -1;
    c->mem_ring = NULL;
    c->ops = NULL;
}

#define ZC_MAX_STREAMS 256
#define ZC_MAX_URING_DEPTH 4096

/* --streams, --cpus, --uring-depth, --tcp-maxseg (issue 14) */
static int validate_streams(zc_ctx *c)
{
    const zc_params *p = c->p;
    int n = p->streams > 0 ? p->streams : 1;
    if (p->streams < 0 || n > ZC_MAX_STREAMS)
        return zc_fail(c, EINVAL, "--streams must be between 1 and %d, got %d", ZC_MAX_STREAMS, p->streams);
    if (n > 1 && (c->ops->caps & ZC_CAP_ONE_STREAM))
        return zc_fail(c, EOPNOTSUPP, "cannot run as %d parallel streams (the mode handles one stream only)", n);
    if (p->ncpus < 0 || (p->ncpus > 0 && !p->cpus))
        return zc_fail(c, EINVAL, "--cpus: bad CPU list");
    for (int i = 0; i < p->ncpus; i++)
        if (p->cpus[i] < 0 || p->cpus[i] >= CPU_SETSIZE)
            return zc_fail(c, EINVAL, "--cpus: CPU %d is out of range", p->cpus[i]);
    if (p->uring_depth < 0 || p->uring_depth > ZC_MAX_URING_DEPTH)
        return zc_fail(c, EINVAL, "--uring-depth must be between 1 and %d, got %d", ZC_MAX_URING_DEPTH,
                       p->uring_depth);
    if (p->tcp_maxseg != 0 && (p->tcp_maxseg < 88 || p->tcp_maxseg > ZC_TCP_MAXSEG_MAX))
        return zc_fail(c, EINVAL, "--tcp-maxseg must be between 88 and %d bytes, got %d", ZC_TCP_MAXSEG_MAX,
                       p->tcp_maxseg);
    return 0;
}

static int validate(zc_ctx *c, int side)
{
    const zc_params *p = c->p;
    if (p->side != side)
        return zc_fail(c, EINVAL, "parameters are for the other side");
    c->ops = zc_find_mode(side, p->mode);
    if (!c->ops) {
        char names[256] = "";
        for (int i = 0; i < zc_mode_count(side); i++) {
            if (i)
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, zc_mode_name(side, i), sizeof names - strlen(names) - 1);
        }
        return zc_fail(c, EINVAL, "unknown %s mode (this build has: %s)", side == ZC_SIDE_SEND ? "send" : "receive",
                       names);
    }
    char why[256];
    if (zc_mode_available(side, p->mode, why, sizeof why) != 1)
        return zc_fail(c, EOPNOTSUPP, "cannot run on this kernel: %s", why);
    if (p->buffer == 0 || p->buffer > (1ULL << 30))
        return zc_fail(c, EINVAL, "--buffer must be between 1 byte and 1GiB, got %llu", (unsigned long long)p->buffer);
    if (p->subblocks < 1 || (uint64_t)p->subblocks > p->buffer)
        return zc_fail(c, EINVAL, "--subblocks must be between 1 and --buffer (%llu), got %d",
                       (unsigned long long)p->buffer, p->subblocks);
    if (!(p->timeout_s > 0))
        return zc_fail(c, EINVAL, "--timeout must be > 0");
    if (p->window > INT_MAX / 2)
        return zc_fail(c, EINVAL, "--window %llu is too large", (unsigned long long)p->window);
    if (p->cpu >= CPU_SETSIZE)
        return zc_fail(c, EINVAL, "--cpu %d is out of range", p->cpu);
    c->buffer = (size_t)p->buffer;
    c->sub = (c->buffer + (size_t)p->subblocks - 1) / (size_t)p->subblocks;
    return validate_streams(c);
}

static int pin_cpu(zc_ctx *c)
{
    /* --cpus: stream i on the i-th CPU of the list (round robin), whatever --cpu says; this thread only */
    int cpu = c->p->ncpus > 0 ? c->p->cpus[c->stream % c->p->ncpus] : c->p->cpu;
    if (cpu < 0)
        return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0)
        return zc_fail_errno(c, "sched_setaffinity(cpu %d)", cpu);
    return 0;
}

static int open_source(zc_ctx *c)
{
    const zc_params *p = c->p;
    if (!p->source || !*p->source || strcmp(p->source, "mem") == 0) {
        c->src_mem = 1;
        if (!p->bytes_set)
            return zc_fail(c, EINVAL, "--bytes is required with source mem");
        c->total = p->bytes;
        c->total_known = 1;
        return 0;
    }
    c->fd = open(p->source, O_RDONLY | O_CLOEXEC);
    if (c->fd < 0)
        return zc_fail_errno(c, "cannot open source %s", p->source);
    struct stat st;
    if (fstat(c->fd, &st) < 0)
        return zc_fail_errno(c, "fstat of source %s", p->source);
    if (S_ISDIR(st.st_mode))
        return zc_fail(c, EINVAL, "source %s is a directory", p->source);
    c->total_known = 1;
    if (S_ISREG(st.st_mode)) {
        c->fd_is_reg = 1;
        if (p->bytes_set && (uint64_t)st.st_size < p->bytes)
            return zc_fail(c, EINVAL, "source %s is %llu bytes, shorter than --bytes %llu", p->source,
                           (unsigned long long)st.st_size, (unsigned long long)p->bytes);
        c->total = p->bytes_set ? p->bytes : (uint64_t)st.st_size;
        return 0;
    }
    c->src_zero = S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 5);
    if (!p->bytes_set)
        return zc_fail(c, EINVAL, "--bytes is required with source %s (it has no size)", p->source);
    c->total = p->bytes;
    return 0;
}

static int write_zeros(zc_ctx *c, uint64_t from, uint64_t to)
{
    size_t len = 1 << 20;
    unsigned char *z = zc_alloc(c, len, "zero-filling the sink");
    if (!z)
        return -1;
    int rc = 0;
    while (from < to) {
        size_t n = zc_min(len, to - from);
        ssize_t w = pwrite(c->fd, z, n, (off_t)from);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            rc = zc_fail_errno(c, "writing the sink %s once before overwriting it", c->p->sink);
            break;
        }
        from += (uint64_t)w;
    }
    zc_free(z, len);
    if (rc == 0 && fsync(c->fd) < 0)
        rc = zc_fail_errno(c, "fsync of the sink %s after writing it once", c->p->sink);
    return rc;
}

static const char *sink_state_name(int s)
{
    return s == ZC_SINK_FRESH ? "fresh" : s == ZC_SINK_PREALLOCATED ? "preallocated" : "overwrite";
}

static int open_sink(zc_ctx *c)
{
    const zc_params *p = c->p;
    const char *path = p->sink && *p->sink ? p->sink : "/dev/null";
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode))
        return zc_fail(c, EINVAL, "sink %s is a directory", path);
    int reg = !exists || S_ISREG(st.st_mode);
    if (p->sink_state < ZC_SINK_FRESH || p->sink_state > ZC_SINK_OVERWRITE)
        return zc_fail(c, EINVAL, "unknown --sink-state %d", p->sink_state);
    if (!reg && p->sink_state != ZC_SINK_FRESH)
        return zc_fail(c, EINVAL, "--sink-state %s needs a regular-file sink, not %s", sink_state_name(p->sink_state),
                       path);
    if (!reg && p->fsync)
        return zc_fail(c, EINVAL, "--fsync needs a regular-file sink, not %s", path);
    if (p->sink_state != ZC_SINK_FRESH && !p->bytes_set)
        return zc_fail(c, EINVAL, "--sink-state %s needs --bytes", sink_state_name(p->sink_state));
    int flags = O_RDWR | O_CREAT | O_CLOEXEC;
    if (reg && p->sink_state != ZC_SINK_OVERWRITE)
        flags |= O_TRUNC;
    c->fd = open(path, flags, 0644);
    if (c->fd < 0)
        return zc_fail_errno(c, "cannot open sink %s", path);
    if (fstat(c->fd, &st) < 0)
        return zc_fail_errno(c, "fstat of sink %s", path);
    c->fd_is_reg = S_ISREG(st.st_mode);
    if (p->sink_state == ZC_SINK_PREALLOCATED && p->bytes > 0 &&
        fallocate(c->fd, 0, 0, (off_t)p->bytes) < 0)
        return zc_fail_errno(c, "fallocate of %llu bytes for sink %s", (unsigned long long)p->bytes, path);
    if (p->sink_state == ZC_SINK_OVERWRITE && (uint64_t)st.st_size < p->bytes &&
        write_zeros(c, (uint64_t)st.st_size, p->bytes) < 0)
        return -1;
    if (fstat(c->fd, &st) < 0)
        return zc_fail_errno(c, "fstat of sink %s", path);
    c->orig_size = (uint64_t)st.st_size;
    c->total_known = p->bytes_set;
    c->total = p->bytes;
    return 0;
}

static int resolve(zc_ctx *c, int passive, struct addrinfo **res)
{
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
    char port[16];
    snprintf(port, sizeof port, "%d", c->p->port);
    const char *host = c->p->host && *c->p->host ? c->p->host : NULL;
    int rc = getaddrinfo(host, port, &hints, res);
    if (rc != 0)
        return zc_fail(c, EINVAL, "cannot resolve address %s: %s", host ? host : "(any)", gai_strerror(rc));
    return 0;
}

static int set_window(zc_ctx *c, int fd, int opt, const char *name)
{
    if (!c->p->window)
        return 0;
    int v = (int)c->p->window;
    if (setsockopt(fd, SOL_SOCKET, opt, &v, sizeof v) < 0)
        return zc_fail_errno(c, "setsockopt(%s, %d)", name, v);
    return 0;
}

static int do_listen(zc_ctx *c, int *port)
{
    struct addrinfo *res;
    if (resolve(c, 1, &res) < 0)
        return -1;
    int rc = -1;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
            zc_fail_errno(c, "socket");
            continue;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (set_window(c, fd, SO_RCVBUF, "SO_RCVBUF") < 0) {
            close(fd);
            break;
        }
        /* --tcp-maxseg (or what the mode asked for): caps the MSS the accepted connection advertises */
        int mss = c->p->tcp_maxseg > 0 ? c->p->tcp_maxseg : c->listen_maxseg;
        if (mss > 0 && setsockopt(fd, IPPROTO_TCP, TCP_MAXSEG, &mss, sizeof mss) < 0) {
            zc_fail_errno(c, "setsockopt(TCP_MAXSEG, %d) on the listening socket", mss);
            close(fd);
            break;
        }
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, c->nstreams > 1 ? c->nstreams : 1) < 0) {
            zc_fail_errno(c, "cannot listen on %s port %d", c->p->host ? c->p->host : "*", c->p->port);
            close(fd);
            continue;
        }
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (getsockname(fd, (struct sockaddr *)&ss, &sl) < 0) {
            zc_fail_errno(c, "getsockname");
            close(fd);
            break;
        }
        *port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                : ((struct sockaddr_in *)&ss)->sin_port);
        c->listen_fd = fd;
        rc = 0;
        break;
    }
    freeaddrinfo(res);
    return rc;
}

static int poll_deadline(zc_ctx *c, int fd, short events, const char *doing)
{
    for (;;) {
        int64_t left = c->deadline_ns - zc_now_ns();
        if (left <= 0)
            return zc_fail(c, ETIMEDOUT, "timed out after %gs while %s", c->p->timeout_s, doing);
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, (int)((left + 999999) / 1000000));
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return zc_fail_errno(c, "poll while %s", doing);
    }
}

static int do_connect(zc_ctx *c)
{
    struct addrinfo *res;
    if (resolve(c, 0, &res) < 0)
        return -1;
    int rc = -1;
    for (struct addrinfo *ai = res; ai && rc < 0; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            zc_fail_errno(c, "socket");
            continue;
        }
        if (set_window(c, fd, SO_SNDBUF, "SO_SNDBUF") < 0) {
            close(fd);
            break;
        }
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
            if (errno != EINPROGRESS) {
                zc_fail_errno(c, "connect to %s port %d", c->p->host, c->p->port);
                close(fd);
                continue;
            }
            if (poll_deadline(c, fd, POLLOUT, "connecting") < 0) {
                close(fd);
                break;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr) {
                errno = soerr;
                zc_fail_errno(c, "connect to %s port %d", c->p->host, c->p->port);
                close(fd);
                continue;
            }
        }
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
        c->sock = fd;
        rc = 0;
    }
    freeaddrinfo(res);
    return rc;
}

static void read_sock_info(zc_ctx *c)
{
    int v;
    socklen_t l = sizeof v;
    if (getsockopt(c->sock, SOL_SOCKET, SO_SNDBUF, &v, &l) == 0)
        c->m.sndbuf = v;
    l = sizeof v;
    if (getsockopt(c->sock, SOL_SOCKET, SO_RCVBUF, &v, &l) == 0)
        c->m.rcvbuf = v;
}

static void read_tcp_info(zc_ctx *c)
{
    struct tcp_info ti;
    socklen_t l = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(c->sock, IPPROTO_TCP, TCP_INFO, &ti, &l) < 0)
        return;
    c->m.tcp_rtt_us = ti.tcpi_rtt;
    c->m.tcp_rttvar_us = ti.tcpi_rttvar;
    c->m.tcp_retransmits = ti.tcpi_retransmits;
    c->m.tcp_total_retrans = ti.tcpi_total_retrans;
    c->m.tcp_snd_cwnd = ti.tcpi_snd_cwnd;
    c->m.tcp_snd_mss = ti.tcpi_snd_mss;
    c->m.tcp_rcv_mss = ti.tcpi_rcv_mss;
    c->m.tcp_pmtu = ti.tcpi_pmtu;
}

static int64_t tv_us(struct timeval tv) { return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec; }

/* The measured region: the mode's loop (and the receiver's fsync), nothing else. */
static int timed_transfer(zc_ctx *c)
{
    struct rusage r0, r1, self;
    /* host counters (and the sampler) just outside the region: hoststat.c; with parallel streams the
     * group takes them once around all streams (group_run) */
    if (!c->group)
        zc_watch_begin(c);
    getrusage(RUSAGE_THREAD, &r0);
    int64_t t0 = zc_now_ns();
    int rc = c->ops->transfer(c);
    if (rc == 0 && c->p->side == ZC_SIDE_RECV && c->p->fsync) {
        int64_t f0 = zc_now_ns();
        if (fsync(c->fd) < 0)
            rc = zc_fail_errno(c, "fsync of sink %s", c->p->sink);
        c->m.fsync_ns = zc_now_ns() - f0;
    }
    int64_t t1 = zc_now_ns();
    getrusage(RUSAGE_THREAD, &r1);
    if (!c->group)
        zc_watch_end(c);
    getrusage(RUSAGE_SELF, &self);
    c->m.bytes = c->done;
    c->m.wall_ns = t1 - t0;
    c->m.utime_us = tv_us(r1.ru_utime) - tv_us(r0.ru_utime);
    c->m.stime_us = tv_us(r1.ru_stime) - tv_us(r0.ru_stime);
    c->m.minflt = r1.ru_minflt - r0.ru_minflt;
    c->m.majflt = r1.ru_majflt - r0.ru_majflt;
    c->m.nvcsw = r1.ru_nvcsw - r0.ru_nvcsw;
    c->m.nivcsw = r1.ru_nivcsw - r0.ru_nivcsw;
    c->m.maxrss_kib = self.ru_maxrss;
    return rc;
}

/* After the last byte: half-close and wait for the receiver's close, so success on the sender means
 * the receiver consumed everything (a receiver that dies or refuses data turns into an error here). */
static int await_receiver_close(zc_ctx *c)
{
    if (shutdown(c->sock, SHUT_WR) < 0) {
        /* ENOTCONN here means the receiver already reset the connection: report that reason */
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (errno == ENOTCONN)
            errno = getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr ? soerr : ECONNRESET;
        return zc_fail_errno(c, "finishing the transfer (shutdown)");
    }
    char b[256];
    for (;;) {
        ssize_t n = read(c->sock, b, sizeof b);
        if (n == 0)
            return 0;
        if (n > 0)
            return zc_fail(c, EPROTO, "the receiver sent data, which it never should");
        int again = zc_io_retry(c, "waiting for the receiver to finish");
        if (again < 0)
            return -1;
        if (!again)
            return zc_fail_errno(c, "waiting for the receiver to finish");
    }
}

/* Receiver told --bytes: after the last expected byte the sender must close (untimed check), so
 * a sender sending more than agreed is reported instead of being cut off silently. */
static int expect_eof(zc_ctx *c)
{
    char b;
    for (;;) {
        ssize_t n = read(c->sock, &b, 1);
        if (n == 0)
            return 0;
        if (n > 0)
            return zc_fail(c, EPROTO, "the sender sent more than --bytes %llu", (unsigned long long)c->total);
        int again = zc_io_retry(c, "waiting for the sender to close after --bytes");
        if (again < 0)
            return -1;
        if (!again)
            return zc_fail_errno(c, "waiting for the sender to close after --bytes");
    }
}

static int streams_send_run(const zc_params *p, zc_metrics *m, zc_error *err);
static int streams_listen(const zc_params *p, zc_listener *out, zc_error *err);
static int streams_recv_run(zc_ctx *c0, const zc_params *p, zc_metrics *m, zc_error *err);
static void streams_close(zc_ctx *c0);

int zc_send_run(const zc_params *p, zc_metrics *m, zc_error *err)
{
    if (p->streams > 1)
        return streams_send_run(p, m, err);
    zc_ctx ctx, *c = &ctx;
    ctx_init(c, p, err);
    memset(m, 0, sizeof *m);
    int rc = validate(c, ZC_SIDE_SEND);
    if (rc == 0)
        rc = pin_cpu(c);
    if (rc == 0)
        rc = open_source(c);
    if (rc == 0 && c->src_mem)
        rc = zc_mem_ring_init(c);
    if (rc == 0)
        rc = c->ops->setup(c);
    if (rc == 0)
        rc = do_connect(c);
    if (rc == 0)
        rc = zc_set_sock_timeouts(c);
    if (rc == 0 && c->ops->connected)
        rc = c->ops->connected(c);
    if (rc == 0) {
        read_sock_info(c);
        rc = timed_transfer(c);
    }
    if (rc == 0 && c->done != c->total)
        rc = zc_fail(c, EIO, "moved %llu bytes instead of %llu (bug)", (unsigned long long)c->done,
                     (unsigned long long)c->total);
    if (rc == 0) {
        read_tcp_info(c);
        rc = await_receiver_close(c);
    }
    if (rc == 0)
        *m = c->m;
    ctx_cleanup(c);
    return rc;
}

int zc_recv_listen(const zc_params *p, zc_listener *out, zc_error *err)
{
    out->port = 0;
    out->state = NULL;
    if (p->streams > 1)
        return streams_listen(p, out, err);
    zc_ctx *c = calloc(1, sizeof *c);
    if (!c) {
        err->code = ENOMEM;
        snprintf(err->message, sizeof err->message, "recv: out of memory");
        return -1;
    }
    ctx_init(c, p, err);
    int rc = validate(c, ZC_SIDE_RECV);
    if (rc == 0)
        rc = open_sink(c);
    if (rc == 0)
        rc = c->ops->setup(c);
    if (rc == 0)
        rc = do_listen(c, &out->port);
    if (rc < 0) {
        ctx_cleanup(c);
        free(c);
        return -1;
    }
    out->state = c;
    return 0;
}

void zc_listener_close(zc_listener *l)
{
    if (l && l->state && ((zc_ctx *)l->state)->group) {
        streams_close(l->state);
        l->state = NULL;
    }
    if (l && l->state) {
        ctx_cleanup(l->state);
        free(l->state);
        l->state = NULL;
    }
}

int zc_recv_run(const zc_params *p, zc_listener *l, zc_metrics *m, zc_error *err)
{
    memset(m, 0, sizeof *m);
    err->code = 0;
    err->message[0] = '\0';
    zc_ctx *c = l->state;
    if (!c) {
        err->code = EINVAL;
        snprintf(err->message, sizeof err->message, "recv: the listener was already used or closed");
        return -1;
    }
    if (c->group) {
        int rc = streams_recv_run(c, p, m, err);
        zc_listener_close(l);
        return rc;
    }
    c->p = p;
    c->err = err;
    int rc = pin_cpu(c);
    if (rc == 0)
        rc = poll_deadline(c, c->listen_fd, POLLIN, "waiting for the sender to connect");
    if (rc == 0) {
        c->sock = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c->sock < 0)
            rc = zc_fail_errno(c, "accept");
        close(c->listen_fd);
        c->listen_fd = -1;
    }
    if (rc == 0)
        rc = zc_set_sock_timeouts(c);
    if (rc == 0 && c->ops->connected)
        rc = c->ops->connected(c);
    if (rc == 0) {
        read_sock_info(c);
        rc = timed_transfer(c);
    }
    if (rc == 0 && c->total_known && c->done < c->total)
        rc = zc_fail(c, ENODATA, "short transfer: the sender closed the connection after %llu of %llu bytes",
                     (unsigned long long)c->done, (unsigned long long)c->total);
    if (rc == 0) {
        read_tcp_info(c);
        if (c->total_known)
            rc = expect_eof(c);
    }
    if (rc == 0)
        *m = c->m;
    zc_listener_close(l);
    return rc;
}

/* ------------------------------------------------------------------------------------------------
 * Parallel streams (--streams N > 1): N connections, one thread per stream on each side, each moving
 * its own slice of the data: stream i carries bytes [offset_i, offset_i + length_i) of the source and
 * writes them at the same offsets of the sink, so the result is the one-stream file, byte for byte.
 * Slices are multiples of 4096 bytes (the last takes the rest). Each connection starts (untimed) with
 * a 32-byte hello from the sender naming the stream and its slice, since the receiver cannot tell the
 * connections apart by their order of arrival. Everything untimed (opening, connecting, the hellos,
 * mode set-up) happens in the calling thread; the stream threads pin themselves (--cpus), wait at a
 * gate until all exist, then run the timed transfer. Totals: bytes, CPU times, faults and context
 * switches are summed; wall_ns spans the first stream's start to the last one's end (and the group
 * fsync); TCP counters are summed, round-trip times averaged, MSS and path MTU the smallest; sndbuf,
 * rcvbuf and pipe_size are stream 0's. Per-stream metrics go to p->stream_metrics.
 */
#include <pthread.h>

#define ZC_HELLO_MAGIC 0x315343a5u /* "zcs1" */
#define ZC_HELLO_LEN 32
#define ZC_SLICE_ALIGN 4096u

typedef struct zc_group {
    int n;
    zc_ctx *ctx;             /* n contexts; ctx[0] holds the listener (receiver) and the group */
    zc_params *params;       /* each stream's copy of the parameters */
    zc_error *errs;          /* each stream's error */
    int *rc;
    int64_t *t0, *t1;        /* each stream's timed region, CLOCK_MONOTONIC */
    int64_t *tfail;          /* when each failed stream failed: the first failure explains the others */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int go;                  /* 1: start; -1: abort (a thread could not be created) */
} zc_group;

static void stream_slice(uint64_t total, int n, int i, uint64_t *off, uint64_t *len)
{
    uint64_t per = (total / (uint64_t)n) / ZC_SLICE_ALIGN * ZC_SLICE_ALIGN;
    *off = per * (uint64_t)i;
    *len = i == n - 1 ? total - *off : per;
}

static void put_le32(unsigned char *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}
static void put_le64(unsigned char *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t get_le32(const unsigned char *b)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}
static uint64_t get_le64(const unsigned char *b)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
}

static zc_group *group_new(const zc_params *p, zc_error *err)
{
    int n = p->streams;
    zc_group *g = calloc(1, sizeof *g);
    if (g) {
        g->n = n;
        g->ctx = calloc((size_t)n, sizeof *g->ctx);
        g->params = calloc((size_t)n, sizeof *g->params);
        g->errs = calloc((size_t)n, sizeof *g->errs);
        g->rc = calloc((size_t)n, sizeof *g->rc);
        g->t0 = calloc((size_t)n, sizeof *g->t0);
        g->t1 = calloc((size_t)n, sizeof *g->t1);
        g->tfail = calloc((size_t)n, sizeof *g->tfail);
    }
    if (!g || !g->ctx || !g->params || !g->errs || !g->rc || !g->t0 || !g->t1 || !g->tfail) {
        if (g) {
            free(g->tfail);
            free(g->ctx);
            free(g->params);
            free(g->errs);
            free(g->rc);
            free(g->t0);
            free(g->t1);
            free(g);
        }
        err->code = ENOMEM;
        snprintf(err->message, sizeof err->message, "%s: out of memory for %d streams",
                 p->side == ZC_SIDE_SEND ? "send" : "recv", n);
        return NULL;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    for (int i = 0; i < n; i++) {
        g->params[i] = *p;
        g->params[i].fsync = 0;           /* the group fsyncs the sink once, after every stream */
        g->params[i].stream_metrics = NULL;
        g->params[i].stream_offsets = NULL;
        ctx_init(&g->ctx[i], &g->params[i], &g->errs[i]);
        g->ctx[i].stream = i;
        g->ctx[i].nstreams = n;
        g->ctx[i].group = g;
    }
    return g;
}

static void group_free(zc_group *g)
{
    for (int i = 0; i < g->n; i++)
        ctx_cleanup(&g->ctx[i]);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free(g->ctx);
    free(g->params);
    free(g->errs);
    free(g->rc);
    free(g->t0);
    free(g->t1);
    free(g->tfail);
    free(g);
}

/* The error of the stream that failed first (in time; set-up failures come in stream order), as
 * "<side> <mode>: stream i of n: <what>"; 0 if none failed. */
static int group_error(zc_group *g, zc_error *err)
{
    int first = -1;
    for (int i = 0; i < g->n; i++)
        if (g->rc[i] != 0 && (first < 0 || g->tfail[i] < g->tfail[first]))
            first = i;
    if (first < 0)
        return 0;
    const char *msg = g->errs[first].message;
    const char *rest = strstr(msg, ": ");
    int head = rest ? (int)(rest - msg) : 0;
    err->code = g->errs[first].code ? g->errs[first].code : EIO;
    char tail[sizeof err->message];
    snprintf(tail, sizeof tail, "%s", rest ? rest + 2 : msg);
    int k = snprintf(err->message, sizeof err->message, "%.*s: stream %d of %d: ", head, msg, first, g->n);
    if (k > 0 && (size_t)k < sizeof err->message)
        snprintf(err->message + k, sizeof err->message - (size_t)k, "%.*s",
                 (int)(sizeof err->message - (size_t)k - 1), tail);
    return -1;
}

/* Sender: the hello of stream c->stream, written before the timed region. */
static int send_hello(zc_ctx *c)
{
    unsigned char b[ZC_HELLO_LEN];
    memset(b, 0, sizeof b);
    put_le32(b, ZC_HELLO_MAGIC);
    put_le32(b + 4, (uint32_t)c->stream);
    put_le32(b + 8, (uint32_t)c->nstreams);
    put_le64(b + 16, c->base);
    put_le64(b + 24, c->total);
    size_t off = 0;
    while (off < sizeof b) {
        ssize_t n = send(c->sock, b + off, sizeof b - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        int again = n < 0 ? zc_io_retry(c, "sending the stream hello") : 0;
        if (again < 0)
            return -1;
        if (!again)
            return zc_fail_errno(c, "sending the stream hello");
    }
    return 0;
}

/* The stream threads: pin, wait at the gate, run the timed transfer and the per-stream ending. */
static void *stream_thread(void *arg)
{
    zc_ctx *c = arg;
    zc_group *g = c->group;
    int i = c->stream;
    int rc = pin_cpu(c);
    pthread_mutex_lock(&g->lock);
    while (g->go == 0)
        pthread_cond_wait(&g->cond, &g->lock);
    int go = g->go;
    pthread_mutex_unlock(&g->lock);
    if (go < 0) {
        g->rc[i] = zc_fail(c, EAGAIN, "another stream's thread could not be created");
        g->tfail[i] = INT64_MAX;
        return NULL;
    }
    if (rc == 0) {
        g->t0[i] = zc_now_ns();
        rc = timed_transfer(c);
        g->t1[i] = zc_now_ns();
    }
    if (c->p->side == ZC_SIDE_SEND) {
        if (rc == 0 && c->done != c->total)
            rc = zc_fail(c, EIO, "moved %llu bytes instead of %llu (bug)", (unsigned long long)c->done,
                         (unsigned long long)c->total);
        if (rc == 0) {
            read_tcp_info(c);
            rc = await_receiver_close(c);
        }
    } else {
        if (rc == 0 && c->total_known && c->done < c->total)
            rc = zc_fail(c, ENODATA, "short transfer: the sender closed the connection after %llu of %llu bytes",
                         (unsigned long long)c->done, (unsigned long long)c->total);
        if (rc == 0) {
            read_tcp_info(c);
            if (c->total_known)
                rc = expect_eof(c);
        }
    }
    g->rc[i] = rc;
    g->tfail[i] = rc ? zc_now_ns() : 0;
    return NULL;
}

/* The streams of c's group (c itself without one): the host sampler (hoststat.c) sums their bytes. */
int zc_group_size(const zc_ctx *c) { return c->group ? c->group->n : 1; }
const zc_ctx *zc_group_stream(const zc_ctx *c, int i) { return c->group ? &c->group->ctx[i] : c; }

/* Start one thread per stream, open the gate, wait for all; the group's timed span in t0, t1. The
 * host watch (zc_params.watch: /proc counters, the sampler) begins once for the whole group, on
 * ctx[0], just before the gate opens; the caller ends it (zc_watch_end(&g->ctx[0])) after the span
 * (the receiver after its fsync), whatever the outcome. */
static void group_run(zc_group *g, int64_t *t0, int64_t *t1)
{
    pthread_t *th = calloc((size_t)g->n, sizeof *th);
    int started = 0;
    if (!th) {
        for (int i = 0; i < g->n; i++)
            g->rc[i] = zc_fail(&g->ctx[i], ENOMEM, "out of memory for the stream threads");
        return;
    }
    for (; started < g->n; started++) {
        int e = pthread_create(&th[started], NULL, stream_thread, &g->ctx[started]);
        if (e) {
            errno = e;
            g->rc[started] = zc_fail_errno(&g->ctx[started], "pthread_create for stream %d", started);
            break;
        }
    }
    if (started == g->n)
        zc_watch_begin(&g->ctx[0]);
    pthread_mutex_lock(&g->lock);
    g->go = started == g->n ? 1 : -1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    free(th);
    *t0 = INT64_MAX;
    *t1 = 0;
    for (int i = 0; i < g->n; i++) {
        if (g->t0[i] && g->t0[i] < *t0)
            *t0 = g->t0[i];
        if (g->t1[i] > *t1)
            *t1 = g->t1[i];
    }
    if (*t0 == INT64_MAX)
        *t0 = *t1;
}

/* Totals of the streams (the header comment above says how each metric combines). */
static void group_totals(zc_group *g, zc_metrics *m, int64_t wall_ns)
{
    memset(m, 0, sizeof *m);
    int64_t rtt = 0, rttvar = 0;
    for (int i = 0; i < g->n; i++) {
        const zc_metrics *s = &g->ctx[i].m;
        m->bytes += s->bytes;
        m->utime_us += s->utime_us;
        m->stime_us += s->stime_us;
        m->minflt += s->minflt;
        m->majflt += s->majflt;
        m->nvcsw += s->nvcsw;
        m->nivcsw += s->nivcsw;
        if (s->maxrss_kib > m->maxrss_kib)
            m->maxrss_kib = s->maxrss_kib;
        m->zc_completions += s->zc_completions;
        m->zc_copied += s->zc_copied;
        m->zc_recv_mapped += s->zc_recv_mapped;
        m->zc_recv_copied += s->zc_recv_copied;
        m->uring_cqes += s->uring_cqes;
        if (s->uring_bundle > m->uring_bundle)
            m->uring_bundle = s->uring_bundle;
        m->tcp_retransmits += s->tcp_retransmits;
        m->tcp_total_retrans += s->tcp_total_retrans;
        m->tcp_snd_cwnd += s->tcp_snd_cwnd;
        rtt += s->tcp_rtt_us;
        rttvar += s->tcp_rttvar_us;
#define ZC_MIN_OF(f) if (i == 0 || s->f < m->f) m->f = s->f
        ZC_MIN_OF(tcp_snd_mss);
        ZC_MIN_OF(tcp_rcv_mss);
        ZC_MIN_OF(tcp_pmtu);
#undef ZC_MIN_OF
    }
    m->tcp_rtt_us = rtt / g->n;
    m->tcp_rttvar_us = rttvar / g->n;
    m->sndbuf = g->ctx[0].m.sndbuf;
    m->rcvbuf = g->ctx[0].m.rcvbuf;
    m->pipe_size = g->ctx[0].m.pipe_size;
    m->wall_ns = wall_ns;
}

static void group_stream_metrics(zc_group *g, const zc_params *p)
{
    if (!p->stream_metrics)
        return;
    for (int i = 0; i < g->n; i++) {
        p->stream_metrics[i] = g->ctx[i].m;
        if (p->stream_offsets)
            p->stream_offsets[i] = g->ctx[i].base;
    }
}

static int streams_send_run(const zc_params *p, zc_metrics *m, zc_error *err)
{
    memset(m, 0, sizeof *m);
    zc_group *g = group_new(p, err);
    if (!g)
        return -1;
    int rc = 0;
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = validate(c, ZC_SIDE_SEND);
        if (rc == 0)
            rc = open_source(c); /* each stream its own file description (own offset) */
        if (rc == 0) {
            uint64_t off, len;
            stream_slice(c->total, g->n, i, &off, &len);
            c->base = off;
            c->total = len;
            if (c->fd >= 0 && c->fd_is_reg && lseek(c->fd, (off_t)off, SEEK_SET) < 0)
                rc = zc_fail_errno(c, "lseek of source %s to the stream's offset %llu", p->source,
                                   (unsigned long long)off);
        }
        if (rc == 0 && c->src_mem)
            rc = zc_mem_ring_init(c);
        if (rc == 0)
            rc = c->ops->setup(c);
        g->rc[i] = rc;
    }
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = do_connect(c);
        if (rc == 0)
            rc = zc_set_sock_timeouts(c);
        if (rc == 0)
            rc = send_hello(c);
        if (rc == 0 && c->ops->connected)
            rc = c->ops->connected(c);
        if (rc == 0)
            read_sock_info(c);
        g->rc[i] = rc;
    }
    int64_t t0 = 0, t1 = 0;
    if (rc == 0)
        group_run(g, &t0, &t1);
    zc_watch_end(&g->ctx[0]);
    rc = group_error(g, err);
    if (rc == 0) {
        group_totals(g, m, t1 - t0);
        group_stream_metrics(g, p);
    }
    group_free(g);
    return rc;
}

/* Receiver set-up: stream 0 prepares the sink (fresh, preallocated, overwritten) and listens; the
 * others open the prepared sink again, each with its own offset. */
static int streams_listen(const zc_params *p, zc_listener *out, zc_error *err)
{
    zc_group *g = group_new(p, err);
    if (!g)
        return -1;
    zc_ctx *c0 = &g->ctx[0];
    int rc = 0;
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = validate(c, ZC_SIDE_RECV);
        if (rc == 0 && i == 0) {
            rc = open_sink(c);
        } else if (rc == 0) {
            const char *path = p->sink && *p->sink ? p->sink : "/dev/null";
            c->fd = open(path, O_RDWR | O_CLOEXEC);
            if (c->fd < 0)
                rc = zc_fail_errno(c, "cannot open sink %s again for stream %d", path, i);
            c->fd_is_reg = c0->fd_is_reg;
            c->orig_size = c0->orig_size;
            c->total_known = c0->total_known;
            c->total = c0->total;
        }
        if (rc == 0)
            rc = c->ops->setup(c);
    }
    if (rc == 0)
        rc = do_listen(c0, &out->port);
    if (rc < 0) {
        for (int i = 0; i < g->n; i++)
            if (g->errs[i].code) {
                *err = g->errs[i];
                break;
            }
        group_free(g);
        return -1;
    }
    out->state = c0;
    return 0;
}

static void streams_close(zc_ctx *c0) { group_free(c0->group); }

/* Read exactly len bytes within the deadline (untimed hand-shake). */
static int read_hello(zc_ctx *c, int fd, unsigned char *b)
{
    size_t got = 0;
    while (got < ZC_HELLO_LEN) {
        if (poll_deadline(c, fd, POLLIN, "waiting for the senders' stream hellos") < 0)
            return -1;
        ssize_t n = recv(fd, b + got, ZC_HELLO_LEN - got, MSG_DONTWAIT);
        if (n == 0)
            return zc_fail(c, EPROTO, "a connection closed before its stream hello (is the sender running "
                                      "--streams %d too?)", c->nstreams);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return zc_fail_errno(c, "reading a stream hello");
        }
        got += (size_t)n;
    }
    return 0;
}

static int streams_recv_run(zc_ctx *c0, const zc_params *p, zc_metrics *m, zc_error *err)
{
    zc_group *g = c0->group;
    memset(m, 0, sizeof *m);
    err->code = 0;
    err->message[0] = '\0';
    int rc = 0;
    /* accept all n connections and sort them by their hello */
    for (int k = 0; k < g->n && rc == 0; k++) {
        rc = poll_deadline(c0, c0->listen_fd, POLLIN, "waiting for the senders' streams to connect");
        int fd = rc == 0 ? accept4(c0->listen_fd, NULL, NULL, SOCK_CLOEXEC) : -1;
        if (rc == 0 && fd < 0)
            rc = zc_fail_errno(c0, "accept");
        unsigned char b[ZC_HELLO_LEN];
        if (rc == 0 && (rc = read_hello(c0, fd, b)) == 0) {
            uint32_t idx = get_le32(b + 4), cnt = get_le32(b + 8);
            uint64_t off = get_le64(b + 16), len = get_le64(b + 24);
            if (get_le32(b) != ZC_HELLO_MAGIC)
                rc = zc_fail(c0, EPROTO, "a connection did not start with a stream hello (is the sender running "
                                         "--streams %d too?)", g->n);
            else if ((int)cnt != g->n || idx >= cnt)
                rc = zc_fail(c0, EPROTO, "the sender runs %u streams (this stream %u), the receiver --streams %d",
                             cnt, idx, g->n);
            else if (g->ctx[idx].sock >= 0)
                rc = zc_fail(c0, EPROTO, "two connections claim stream %u", idx);
            if (rc == 0) {
                zc_ctx *c = &g->ctx[idx];
                uint64_t eoff = off, elen = len;
                if (c->total_known)
                    stream_slice(c->total, g->n, (int)idx, &eoff, &elen);
                if (eoff != off || elen != len)
                    rc = zc_fail(c0, EPROTO, "stream %u: the sender sends %llu bytes at offset %llu, the receiver "
                                             "expects %llu at %llu (do both sides have the same --bytes?)",
                                 idx, (unsigned long long)len, (unsigned long long)off,
                                 (unsigned long long)elen, (unsigned long long)eoff);
                if (rc == 0) {
                    c->sock = fd;
                    fd = -1;
                    c->base = off;
                    if (c->total_known)
                        c->total = len;
                }
            }
        }
        if (fd >= 0)
            close(fd);
    }
    if (c0->listen_fd >= 0) {
        close(c0->listen_fd);
        c0->listen_fd = -1;
    }
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = zc_set_sock_timeouts(c);
        if (rc == 0 && c->fd_is_reg && lseek(c->fd, (off_t)c->base, SEEK_SET) < 0)
            rc = zc_fail_errno(c, "lseek of sink %s to the stream's offset %llu", p->sink,
                               (unsigned long long)c->base);
        if (rc == 0 && c->ops->connected)
            rc = c->ops->connected(c);
        if (rc == 0)
            read_sock_info(c);
        if (rc < 0 && c != c0)
            *c0->err = *c->err;
    }
    if (rc < 0) {
        *err = *c0->err;
        return -1;
    }
    int64_t t0 = 0, t1 = 0;
    group_run(g, &t0, &t1);
    rc = group_error(g, err);
    int64_t fsync_ns = 0;
    if (rc == 0 && p->fsync) { /* one fsync of the sink after every stream, inside the timed span */
        int64_t f0 = zc_now_ns();
        if (fsync(c0->fd) < 0) {
            zc_fail_errno(c0, "fsync of sink %s", p->sink);
            *err = *c0->err;
            rc = -1;
        }
        t1 = zc_now_ns();
        fsync_ns = t1 - f0;
    }
    zc_watch_end(c0);
    if (rc == 0) {
        group_totals(g, m, t1 - t0);
        m->fsync_ns = fsync_ns;
        group_stream_metrics(g, p);
    }
    return rc;
}
