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
    return 0;
}

static int pin_cpu(zc_ctx *c)
{
    if (c->p->cpu < 0)
        return 0;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(c->p->cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) < 0)
        return zc_fail_errno(c, "sched_setaffinity(cpu %d)", c->p->cpu);
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
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 1) < 0) {
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
    zc_watch_begin(c); /* host counters (and the sampler) just outside the region: hoststat.c */
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

int zc_send_run(const zc_params *p, zc_metrics *m, zc_error *err)
{
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
