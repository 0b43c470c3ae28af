/* Helpers every mode shares: error text, deadline handling, pipes, buffers and the I/O loops.
 * The data socket blocks (no poll per chunk: a syscall each) but carries SO_SNDTIMEO/SO_RCVTIMEO of at most
 * ZC_TIMEO_SLICE_NS; a call that times out (EAGAIN) fails with ETIMEDOUT past the deadline or re-arms the
 * timeout, and every chunk compares the clock with the deadline, so neither a stalled nor a trickling peer
 * stretches a transfer. A stream sharing its thread (core/mux.c) parks on EAGAIN instead.
 */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define ZC_TIMEO_SLICE_NS (250 * 1000 * 1000LL)

static int vfail(zc_ctx *c, int code, const char *suffix, const char *fmt, va_list ap)
{
    char *buf = c->err->message;
    size_t cap = sizeof c->err->message;
    int n = snprintf(buf, cap, "%s %s: ", c->p->side == ZC_SIDE_SEND ? "send" : "recv",
                     c->ops ? c->ops->name : (c->p->mode ? c->p->mode : "?"));
    if (n < 0 || (size_t)n >= cap)
        n = 0;
    int k = vsnprintf(buf + n, cap - n, fmt, ap);
    if (k > 0 && (size_t)(n + k) < cap && suffix)
        snprintf(buf + n + k, cap - n - k, ": %s", suffix);
    c->err->code = code;
    return -1;
}

int zc_fail(zc_ctx *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(c, code, NULL, fmt, ap);
    va_end(ap);
    return -1;
}

int zc_fail_errno(zc_ctx *c, const char *fmt, ...)
{
    int code = errno;
    char reason[128];
    if (code == EPIPE || code == ECONNRESET)
        snprintf(reason, sizeof reason, "%s (the peer closed the connection or died)", strerror(code));
    else
        snprintf(reason, sizeof reason, "%s", strerror(code));
    va_list ap;
    va_start(ap, fmt);
    vfail(c, code, reason, fmt, ap);
    va_end(ap);
    return -1;
}

int64_t zc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Data that moved within this long before the deadline means the transfer was still going: the timeout is
 * shorter than the transfer, not a stalled peer (a stall shows no progress for at least one timeout slice). */
#define ZC_STILL_MOVING_NS (1000 * 1000 * 1000LL)

int zc_check_deadline(zc_ctx *c, const char *doing)
{
    if (c->fiber) /* the top of every chunk loop: a stream sharing its thread takes its turn here */
        zc_fiber_share(c);
    int64_t now = zc_now_ns();
    if (c->done != c->seen_done || !c->progress_ns) {
        c->seen_done = c->done;
        c->progress_ns = now;
    }
    if (now < c->deadline_ns)
        return 0;
    double idle = (double)(now - c->progress_ns) / 1e9;
    if (c->done > 0 && now - c->progress_ns < ZC_STILL_MOVING_NS)
        return zc_fail(c, ETIMEDOUT, "timed out after %gs while %s, with data still moving (%llu bytes moved, the "
                       "last %.2gs ago): the transfer takes longer than its timeout (raise `timeout`, or lower "
                       "`bytes`)", c->p->timeout, doing, (unsigned long long)c->done, idle);
    return zc_fail(c, ETIMEDOUT, "timed out after %gs while %s (%llu bytes moved, none in the last %.2gs; is the "
                   "peer stalled or gone?)", c->p->timeout, doing, (unsigned long long)c->done, idle);
}

int zc_send_more(zc_ctx *c)
{
    if (c->done >= c->total)
        return 0;
    if (zc_check_deadline(c, "sending") < 0)
        return -1;
    if (c->end_ns && zc_now_ns() >= c->end_ns) {
        c->total = c->done; /* every chunk sent so far is whole: the loops call this between chunks */
        return 0;
    }
    return 1;
}

static int set_timeo(zc_ctx *c, int64_t ns)
{
    struct timeval tv = {.tv_sec = ns / 1000000000LL, .tv_usec = (ns % 1000000000LL) / 1000};
    if (tv.tv_sec == 0 && tv.tv_usec == 0)
        tv.tv_usec = 1000; /* 0 would mean "block forever" */
    if (setsockopt(c->sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) < 0 ||
        setsockopt(c->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) < 0)
        return zc_fail_errno(c, "setsockopt(SO_SNDTIMEO/SO_RCVTIMEO)");
    c->timeo_ns = ns;
    return 0;
}

int zc_set_sock_timeouts(zc_ctx *c)
{
    int64_t left = c->deadline_ns - zc_now_ns();
    if (left <= 0)
        return zc_check_deadline(c, "connecting");
    return set_timeo(c, left < ZC_TIMEO_SLICE_NS ? left : ZC_TIMEO_SLICE_NS);
}

/* a socket timeout fired: fail past the deadline, else re-arm the timeout (shortened to what is left) */
static int after_eagain(zc_ctx *c, const char *doing)
{
    if (zc_check_deadline(c, doing) < 0)
        return -1;
    int64_t left = c->deadline_ns - zc_now_ns();
    if (left < c->timeo_ns)
        return set_timeo(c, left > 0 ? left : 1);
    return 0;
}

int zc_io_retry(zc_ctx *c, const char *doing, const char *failed)
{
    if (errno == EINTR)
        return 1;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        return failed ? zc_fail_errno(c, "%s", failed) : 0;
    if (c->fiber) /* a nonblocking socket of a shared thread: park until it is ready again */
        return zc_fiber_wait(c, c->sock, POLLIN | POLLOUT, doing) < 0 ? -1 : 1;
    return after_eagain(c, doing) < 0 ? -1 : 1;
}

int zc_open_pipe(zc_ctx *c, size_t unit)
{
    /* the flag tells the planner that pipe_size applies: a mode must not use a pipe without it */
    if (!(c->ops->caps & ZC_CAP_PIPE))
        return zc_fail(c, EINVAL, "opens a pipe but does not declare ZC_CAP_PIPE (bug)");
    if (pipe2(c->pipe, O_CLOEXEC) < 0)
        return zc_fail_errno(c, "pipe2");
    /* auto: at least one unit, so a splice/vmsplice pair moves a whole one; an explicit size is applied or fails */
    size_t want = c->p->pipe_size;
    int explicit_size = want != 0;
    if (!explicit_size) {
        int cur = fcntl(c->pipe[1], F_GETPIPE_SZ);
        want = (cur > 0 && (size_t)cur >= unit) ? 0 : unit;
    }
    if (want) {
        if (want > (size_t)0x7fffffff)
            return zc_fail(c, EINVAL, "pipe size %zu is too large", want);
        if (fcntl(c->pipe[1], F_SETPIPE_SZ, (int)want) < 0) {
            if (explicit_size)
                return zc_fail_errno(c, "fcntl(F_SETPIPE_SZ, %zu) (see /proc/sys/fs/pipe-max-size)", want);
            /* auto beyond pipe-max-size for an unprivileged user: keep the largest allowed */
            long mx = zc_read_sysctl("/proc/sys/fs/pipe-max-size", 0);
            if (mx <= 0 || fcntl(c->pipe[1], F_SETPIPE_SZ, (int)mx) < 0)
                return zc_fail_errno(c, "fcntl(F_SETPIPE_SZ, %zu)", want);
        }
    }
    int sz = fcntl(c->pipe[1], F_GETPIPE_SZ);
    if (sz <= 0)
        return zc_fail_errno(c, "fcntl(F_GETPIPE_SZ)");
    c->pipe_cap = (size_t)sz;
    c->m.pipe_size = sz;
    return 0;
}

long zc_read_sysctl(const char *path, long dflt)
{
    FILE *f = fopen(path, "r");
    long v = dflt;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = dflt;
        fclose(f);
    }
    return v;
}

void *zc_alloc(zc_ctx *c, size_t len, const char *what)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        zc_fail_errno(c, "mmap of %zu bytes for %s", len, what);
        return NULL;
    }
    return p;
}

void zc_free(void *p, size_t len)
{
    if (p)
        munmap(p, len ? len : 1);
}

int zc_buf_state_new(zc_ctx *c, const char *what)
{
    zc_buf_state *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    s->buf = zc_alloc(c, c->buffer, what);
    return s->buf ? 0 : -1;
}

void zc_buf_state_free(zc_ctx *c)
{
    zc_buf_state *s = c->priv;
    if (s) {
        zc_free(s->buf, c->buffer);
        zc_free(s, sizeof *s);
        c->priv = NULL;
    }
}

int zc_mem_ring_init(zc_ctx *c)
{
    /* one period plus one buffer: any chunk is contiguous at ring + off % period; never written again */
    c->mem_ring_len = zc_mem_pattern_period() + c->buffer;
    c->mem_ring = zc_alloc(c, c->mem_ring_len, "the source mem pattern");
    if (!c->mem_ring)
        return -1;
    zc_mem_pattern(0, c->mem_ring, c->mem_ring_len);
    return 0;
}

int zc_sock_write_all(zc_ctx *c, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = send(c->sock, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= n;
            c->done += n;
            continue;
        }
        int again = n < 0 ? zc_io_retry(c, "writing to the socket", NULL) : 0;
        if (again < 0)
            return -1;
        if (!again)
            return zc_fail_errno(c, "write to the socket");
    }
    return 0;
}

ssize_t zc_sock_read(zc_ctx *c, void *buf, size_t len)
{
    for (;;) {
        ssize_t n = read(c->sock, buf, len);
        if (n >= 0 || zc_io_retry(c, "reading from the socket", "read from the socket") < 0)
            return n;
    }
}

int zc_file_read_full(zc_ctx *c, void *buf, size_t len)
{
    unsigned char *p = buf;
    while (len) {
        ssize_t n = read(c->fd, p, len);
        if (n > 0) {
            p += n;
            len -= n;
        } else if (n == 0) {
            return zc_fail(c, EIO, "source %s ended after %llu bytes, before the %llu requested",
                           c->p->source, (unsigned long long)(c->done + (p - (unsigned char *)buf)),
                           (unsigned long long)c->total);
        } else if (errno != EINTR) {
            return zc_fail_errno(c, "read from source %s", c->p->source);
        }
    }
    return 0;
}

int zc_file_write_all(zc_ctx *c, const void *buf, size_t len)
{
    const unsigned char *p = buf;
    while (len) {
        ssize_t n = write(c->fd, p, len);
        if (n > 0) {
            p += n;
            len -= n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else {
            if (n == 0)
                errno = EIO;
            return zc_fail_errno(c, "write to sink %s", c->p->sink);
        }
    }
    return 0;
}

int zc_splice_all(zc_ctx *c, int in, loff_t *off_in, int out, loff_t *off_out, size_t len,
                  unsigned flags, const char *what)
{
    while (len) {
        ssize_t n = splice(in, off_in, out, off_out, len, flags);
        if (n > 0) {
            len -= n;
            continue;
        }
        if (n == 0)
            return zc_fail(c, EIO, "%s: unexpected end of input with %zu bytes still to move", what, len);
        if (zc_io_retry(c, what, what) < 0)
            return -1;
    }
    return 0;
}

int zc_vmsplice_out(zc_ctx *c, const unsigned char *buf, size_t len, int out, loff_t *off_out)
{
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    return zc_vmsplice_iov_out(c, &iov, 1, out, off_out);
}

int zc_vmsplice_iov_out(zc_ctx *c, struct iovec *iov, size_t n, int out, loff_t *off_out)
{
    unsigned flags = c->p->gift ? SPLICE_F_GIFT : 0;
    const char *what = out == c->sock ? "splice pipe -> socket" : "splice pipe -> sink";
    while (n) {
        if (!iov->iov_len) {
            iov++;
            n--;
            continue;
        }
        /* one buffer: at most a pipe-full a call (the pipe takes no more before it is drained) */
        size_t whole = iov->iov_len;
        if (n == 1)
            iov->iov_len = zc_min(c->pipe_cap, whole);
        ssize_t got = vmsplice(c->pipe[1], iov, n < IOV_MAX ? n : IOV_MAX, flags);
        if (n == 1)
            iov->iov_len = whole;
        if (got < 0) {
            if (errno == EINTR)
                continue;
            return zc_fail_errno(c, "vmsplice into the pipe");
        }
        if (got == 0)
            return zc_fail(c, EIO, "vmsplice into the pipe moved nothing");
        if (zc_splice_all(c, c->pipe[0], NULL, out, off_out, (size_t)got, SPLICE_F_MOVE, what) < 0)
            return -1;
        if (out == c->sock)
            c->done += got;
        for (size_t left = (size_t)got; left;) {   /* advance past what moved */
            size_t take = zc_min(left, iov->iov_len);
            iov->iov_base = (unsigned char *)iov->iov_base + take;
            iov->iov_len -= take;
            left -= take;
            if (!iov->iov_len) {
                iov++;
                n--;
            }
        }
    }
    return 0;
}
