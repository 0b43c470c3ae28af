/* The connections of a run, all untimed: resolve, listen (--window, --tcp-maxseg), connect within the
 * deadline, read back the socket's buffers and TCP_INFO, and the exchanges around the transfer: the stream
 * hello (every connection: which slice it carries, and the run's --nonce, proving it is the run's own
 * sender's), the sender's wait for the receiver's close, the receiver's check that no more than --bytes came.
 * A hello is 48 bytes, little-endian: magic "zcs2", stream index and count (u32), 4 zero bytes, the slice's
 * offset and length (u64), the nonce (16 bytes).
 */
#include "zc_core.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define ZC_HELLO_MAGIC 0x325343a5u /* "zcs2" */

/* n bytes (4 or 8) little-endian */
static void put_le(unsigned char *b, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t get_le(const unsigned char *b, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | b[i];
    return v;
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

int zc_listen(zc_ctx *c, int backlog, int *port)
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
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, backlog) < 0) {
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

int zc_poll_deadline(zc_ctx *c, int fd, short events, const char *doing)
{
    for (;;) {
        int64_t left = c->deadline_ns - zc_now_ns();
        if (left <= 0)
            return zc_fail(c, ETIMEDOUT, "timed out after %gs while %s", c->p->timeout, doing);
        struct pollfd pfd = {.fd = fd, .events = events};
        int n = poll(&pfd, 1, (int)((left + 999999) / 1000000));
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return zc_fail_errno(c, "poll while %s", doing);
    }
}

int zc_connect(zc_ctx *c)
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
            if (zc_poll_deadline(c, fd, POLLOUT, "connecting") < 0) {
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

void zc_read_sock_info(zc_ctx *c)
{
    int v;
    socklen_t l = sizeof v;
    if (getsockopt(c->sock, SOL_SOCKET, SO_SNDBUF, &v, &l) == 0)
        c->m.sndbuf = v;
    l = sizeof v;
    if (getsockopt(c->sock, SOL_SOCKET, SO_RCVBUF, &v, &l) == 0)
        c->m.rcvbuf = v;
}

void zc_read_tcp_info(zc_ctx *c)
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

/* Read until the peer closes: 0, or -1 when it sent anything (EPROTO) or the read failed. */
static int await_eof(zc_ctx *c, const char *doing)
{
    char b;
    for (;;) {
        ssize_t n = read(c->sock, &b, 1);
        if (n == 0)
            return 0;
        if (n > 0 && c->p->side == ZC_SIDE_SEND)
            return zc_fail(c, EPROTO, "the receiver sent data, which it never should");
        if (n > 0)
            return zc_fail(c, EPROTO, "the sender sent more than --bytes %llu", (unsigned long long)c->total);
        if (zc_io_retry(c, doing, doing) < 0)
            return -1;
    }
}

/* After the last byte: half-close and wait for the receiver's close, so success means it consumed everything */
int zc_await_receiver_close(zc_ctx *c)
{
    if (shutdown(c->sock, SHUT_WR) < 0) {
        /* ENOTCONN here means the receiver already reset the connection: report that reason */
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        if (errno == ENOTCONN)
            errno = getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr ? soerr : ECONNRESET;
        return zc_fail_errno(c, "finishing the transfer (shutdown)");
    }
    return await_eof(c, "waiting for the receiver to finish");
}

/* Receiver told --bytes: the sender must close after the last byte, or sending more is reported (untimed) */
int zc_expect_eof(zc_ctx *c)
{
    return await_eof(c, "waiting for the sender to close after --bytes");
}

/* Sender: the hello of stream c->stream, written before the timed region. */
int zc_send_hello(zc_ctx *c)
{
    unsigned char b[ZC_HELLO_LEN];
    memset(b, 0, sizeof b);
    put_le(b, ZC_HELLO_MAGIC, 4);
    put_le(b + 4, (uint32_t)c->stream, 4);
    put_le(b + 8, (uint32_t)c->nstreams, 4);
    put_le(b + 16, c->base, 8);
    put_le(b + 24, c->total, 8);
    zc_nonce_bytes(c->p->nonce, b + 32); /* checked by zc_validate */
    size_t off = 0;
    while (off < sizeof b) {
        ssize_t n = send(c->sock, b + off, sizeof b - off, MSG_NOSIGNAL);
        if (n > 0) {
            off += (size_t)n;
            continue;
        }
        int again = n < 0 ? zc_io_retry(c, "sending the stream hello", NULL) : 0;
        if (again < 0)
            return -1;
        if (!again)
            return zc_fail_errno(c, "sending the stream hello");
    }
    return 0;
}

int zc_nonce_bytes(const char *hex, unsigned char *out)
{
    memset(out, 0, ZC_NONCE_LEN);
    if (!hex || !*hex)
        return 0;
    if (strlen(hex) != 2 * ZC_NONCE_LEN)
        return -1;
    for (int i = 0; i < 2 * ZC_NONCE_LEN; i++) {
        char ch = hex[i];
        int v = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10
              : ch >= 'A' && ch <= 'F' ? ch - 'A' + 10 : -1;
        if (v < 0)
            return -1;
        out[i / 2] = (unsigned char)(out[i / 2] << 4 | v);
    }
    return 0;
}

/* The receiver: read one stream hello (ZC_HELLO_LEN bytes) from a connection by deadline_ns (untimed). A
 * failure is the connection's, not the run's: the caller drops it and waits for its own sender. */
int zc_read_hello(int fd, unsigned char *b, int64_t deadline_ns, const char **why)
{
    size_t got = 0;
    while (got < ZC_HELLO_LEN) {
        int64_t left = deadline_ns - zc_now_ns();
        if (left <= 0) {
            *why = "sent no stream hello in time";
            return -1;
        }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int n = poll(&pfd, 1, (int)((left + 999999) / 1000000));
        if (n < 0 && errno != EINTR) {
            *why = "poll failed on it";
            return -1;
        }
        if (n <= 0)
            continue;
        ssize_t r = recv(fd, b + got, ZC_HELLO_LEN - got, MSG_DONTWAIT);
        if (r == 0) {
            *why = "closed before a whole stream hello";
            return -1;
        }
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            *why = "failed before a whole stream hello";
            return -1;
        }
        got += (size_t)r;
    }
    return 0;
}

int zc_parse_hello(const unsigned char *b, uint32_t *idx, uint32_t *cnt, uint64_t *off, uint64_t *len,
                   const unsigned char **nonce)
{
    *idx = (uint32_t)get_le(b + 4, 4);
    *cnt = (uint32_t)get_le(b + 8, 4);
    *off = get_le(b + 16, 8);
    *len = get_le(b + 24, 8);
    *nonce = b + 32;
    return get_le(b, 4) == ZC_HELLO_MAGIC ? 0 : -1;
}
