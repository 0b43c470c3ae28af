/* The run flow of every mode and stream count: validate, open the source/sink, the mode's setup, connect or
 * listen and accept within the deadline, the timed transfers (group.c, stream.c) and the totals (totals.c).
 * Every connection starts with a stream hello (net.c); the receiver drops (and counts) one from another
 * address than --peer or without the nonce, and waits on for its sender, up to ZC_REFUSED_MAX of them.
 * All set-up stays outside wall_ns; the receiver's --fsync is inside it, once after every stream.
 */
#include "zc_core.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Sender, untimed: each stream validated, its source opened at its slice, its mode set up. */
static int send_prepare(zc_group *g, const zc_params *p)
{
    int rc = 0;
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = zc_validate_ctx(c, ZC_SIDE_SEND);
        if (rc == 0)
            rc = zc_open_source(c); /* each stream its own file description (own offset) */
        if (rc == 0 && zc_duration_set(p)) {
            c->base = 0; /* --duration: every stream sends until the time is up (a /dev/null sink, or one stream) */
        } else if (rc == 0) {
            uint64_t off, len;
            zc_stream_slice(c->total, g->n, i, &off, &len);
            c->base = off;
            c->total = len;
            if (off && c->fd >= 0 && c->fd_is_reg && lseek(c->fd, (off_t)off, SEEK_SET) < 0)
                rc = zc_fail_errno(c, "lseek of source %s to the stream's offset %llu", p->source,
                                   (unsigned long long)off);
        }
        if (rc == 0 && c->src_mem && i == 0)
            rc = zc_mem_ring_init(c);
        if (rc == 0 && c->src_mem && i > 0) { /* one read-only pattern ring for the group: one cache footprint */
            c->mem_ring = g->ctx[0].mem_ring;
            c->mem_ring_len = g->ctx[0].mem_ring_len;
            c->mem_ring_borrowed = 1;
        }
        if (rc == 0 && c->ops->setup)
            rc = c->ops->setup(c);
        g->rc[i] = rc;
    }
    return rc;
}

/* Sender, untimed: each stream connected (and with several, its hello sent). */
static int send_connect(zc_group *g)
{
    int rc = 0;
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = zc_connect(c);
        if (rc == 0)
            rc = zc_set_sock_timeouts(c);
        if (rc == 0)
            rc = zc_send_hello(c);
        if (rc == 0 && c->ops->connected)
            rc = c->ops->connected(c);
        if (rc == 0)
            zc_read_sock_info(c);
        g->rc[i] = rc;
    }
    return rc;
}

int zc_send_run(const zc_params *p, zc_metrics *m, zc_error *err)
{
    memset(m, 0, sizeof *m);
    zc_group *g = zc_group_new(p, err);
    if (!g)
        return -1;
    int rc = send_prepare(g, p);
    if (rc == 0)
        rc = send_connect(g);
    int64_t t0 = 0, t1 = 0;
    if (rc == 0)
        zc_group_run(g, &t0, &t1);
    zc_watch_end(&g->ctx[0]);
    rc = zc_group_error(g, err);
    if (rc == 0) {
        zc_group_totals(g, m, t1 - t0);
        zc_group_stream_metrics(g, p);
    }
    zc_group_free(g);
    return rc;
}

/* --peer: the addresses the sender's connections may come from (a name may have several). */
static int resolve_peer(zc_group *g, const char *peer)
{
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(peer, NULL, &hints, &res);
    if (rc != 0)
        return zc_fail(&g->ctx[0], EINVAL, "--peer: cannot resolve %s: %s", peer, gai_strerror(rc));
    g->npeers = 0;
    for (struct addrinfo *ai = res; ai && g->npeers < (int)(sizeof g->peers / sizeof g->peers[0]); ai = ai->ai_next)
        if (ai->ai_addrlen <= sizeof g->peers[0])
            memcpy(&g->peers[g->npeers++], ai->ai_addr, ai->ai_addrlen);
    freeaddrinfo(res);
    return g->npeers ? 0 : zc_fail(&g->ctx[0], EINVAL, "--peer: %s has no address", peer);
}

/* sa's address as an IPv6 one (an IPv4 one v4-mapped, so both forms of it compare equal) */
static struct in6_addr as_v6(const struct sockaddr_storage *sa)
{
    if (sa->ss_family == AF_INET6)
        return ((const struct sockaddr_in6 *)sa)->sin6_addr;
    struct in6_addr a = {.s6_addr = {[10] = 0xff, [11] = 0xff}};
    memcpy(a.s6_addr + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    return a;
}

static int peer_allowed(const zc_group *g, const struct sockaddr_storage *from)
{
    struct in6_addr a = as_v6(from);
    for (int i = 0; i < g->npeers; i++) {
        struct in6_addr b = as_v6(&g->peers[i]);
        if (memcmp(&a, &b, sizeof a) == 0)
            return 1;
    }
    return g->npeers == 0;
}

/* A dropped connection, into the listener: counted, and the first few described ("ADDR:PORT: why"). */
static void note_refused(zc_listener *l, const struct sockaddr_storage *from, const char *why)
{
    char host[INET6_ADDRSTRLEN + 8] = "?", port[16] = "?";
    getnameinfo((const struct sockaddr *)from, from->ss_family == AF_INET6 ? sizeof(struct sockaddr_in6)
                                                                           : sizeof(struct sockaddr_in),
                host, sizeof host, port, sizeof port, NI_NUMERICHOST | NI_NUMERICSERV);
    l->refused++;
    size_t used = strlen(l->refused_text);
    if (used + 1 < sizeof l->refused_text)
        snprintf(l->refused_text + used, sizeof l->refused_text - used, "%s%s:%s: %s", used ? "; " : "", host, port,
                 why);
}

/* Receiver set-up: stream 0 prepares the sink (fresh, preallocated, overwritten) and listens; the
 * others open the prepared sink again, each with its own offset. The listener holds the group. */
int zc_recv_listen(const zc_params *p, zc_listener *out, zc_error *err)
{
    memset(out, 0, sizeof *out);
    zc_group *g = zc_group_new(p, err);
    if (!g)
        return -1;
    zc_ctx *c0 = &g->ctx[0];
    int rc = 0;
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = zc_validate_ctx(c, ZC_SIDE_RECV);
        if (rc == 0)
            rc = i == 0 ? zc_open_sink(c) : zc_reopen_sink(c, c0);
        if (rc == 0 && c->ops->setup)
            rc = c->ops->setup(c);
    }
    if (rc == 0 && p->peer && *p->peer)
        rc = resolve_peer(g, p->peer);
    if (rc == 0) /* room in the accept queue for the sender's streams beside connections that are dropped */
        rc = zc_listen(c0, g->n + 8, &out->port);
    if (rc < 0) {
        for (int i = 0; i < g->n; i++)
            if (g->errs[i].code) {
                *err = g->errs[i];
                break;
            }
        zc_group_free(g);
        return -1;
    }
    out->state = g;
    return 0;
}

void zc_listener_close(zc_listener *l)
{
    if (l && l->state) {
        zc_group_free(l->state);
        l->state = NULL;
    }
}

/* Connections the receiver drops before giving up on the run (each costs at most ZC_HELLO_WAIT_NS). */
#define ZC_REFUSED_MAX 64
#define ZC_HELLO_WAIT_NS (2 * 1000 * 1000 * 1000LL)

/* One accepted connection, by its hello (checked against --streams and --bytes): 1 = adopted; 0 = not the run's
 * sender (*why: dropped, the run goes on); -1 = the run's sender disagrees with the receiver (the run fails). */
static int adopt_connection(zc_group *g, int fd, const char **why)
{
    zc_ctx *c0 = &g->ctx[0];
    unsigned char b[ZC_HELLO_LEN];
    int64_t until = zc_now_ns() + ZC_HELLO_WAIT_NS;
    if (zc_read_hello(fd, b, until < c0->deadline_ns ? until : c0->deadline_ns, why) < 0)
        return 0;
    uint32_t idx, cnt;
    uint64_t off, len;
    const unsigned char *nonce;
    unsigned char mine[ZC_NONCE_LEN];
    zc_nonce_bytes(c0->p->nonce, mine); /* checked by zc_validate */
    if (zc_parse_hello(b, &idx, &cnt, &off, &len, &nonce) < 0) {
        *why = "did not start with a stream hello";
        return 0;
    }
    if (memcmp(nonce, mine, ZC_NONCE_LEN) != 0) {
        *why = "its stream hello carries another nonce than the run's";
        return 0;
    }
    if ((int)cnt != g->n || idx >= cnt)
        return zc_fail(c0, EPROTO, "the sender runs %u streams (this stream %u), the receiver --streams %d",
                       cnt, idx, g->n);
    if (g->ctx[idx].sock >= 0)
        return zc_fail(c0, EPROTO, "two connections claim stream %u", idx);
    zc_ctx *c = &g->ctx[idx];
    if (g->n == 1) { /* one stream: its byte count is checked by the transfer itself, as it always was */
        c->sock = fd;
        return 1;
    }
    uint64_t eoff = off, elen = len;
    if (c->total_known)
        zc_stream_slice(c->total, g->n, (int)idx, &eoff, &elen);
    if (eoff != off || elen != len)
        return zc_fail(c0, EPROTO, "stream %u: the sender sends %llu bytes at offset %llu, the receiver "
                                   "expects %llu at %llu (do both sides have the same --bytes?)",
                       idx, (unsigned long long)len, (unsigned long long)off,
                       (unsigned long long)elen, (unsigned long long)eoff);
    c->sock = fd;
    c->base = off;
    if (c->total_known)
        c->total = len;
    return 1;
}

/* Receiver, untimed: accept every stream's connection within the deadline and ready it; a connection that is
 * not the run's sender's is dropped, noted in l, and the wait goes on. */
static int recv_accept(zc_group *g, const zc_params *p, zc_listener *l)
{
    zc_ctx *c0 = &g->ctx[0];
    const char *waiting = g->n == 1 ? "waiting for the sender to connect"
                                    : "waiting for the senders' streams to connect";
    int rc = 0;
    for (int k = 0; k < g->n && rc == 0;) {
        rc = zc_poll_deadline(c0, c0->listen_fd, POLLIN, waiting);
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        memset(&from, 0, sizeof from);
        int fd = rc == 0 ? accept4(c0->listen_fd, (struct sockaddr *)&from, &fl, SOCK_CLOEXEC) : -1;
        if (rc == 0 && fd < 0)
            rc = zc_fail_errno(c0, "accept");
        const char *why = NULL;
        int got = 0;
        if (rc == 0 && !peer_allowed(g, &from))
            why = "not the sender's data address (--peer)";
        else if (rc == 0 && (got = adopt_connection(g, fd, &why)) < 0)
            rc = -1;
        if (got == 1) {
            fd = -1;
            k++;
        } else if (rc == 0 && why) {
            note_refused(l, &from, why);
            if (l->refused >= ZC_REFUSED_MAX)
                rc = zc_fail(c0, ECONNREFUSED, "gave up after dropping %d connections that were not the run's "
                             "sender's (%s)", l->refused, l->refused_text);
        }
        if (fd >= 0)
            close(fd);
    }
    if (rc < 0 && l->refused && c0->err->code == ETIMEDOUT) { /* say what came instead of the sender */
        size_t used = strlen(c0->err->message);
        snprintf(c0->err->message + used, sizeof c0->err->message - used, "; dropped %d connection(s): %s",
                 l->refused, l->refused_text);
    }
    if (c0->listen_fd >= 0) {
        close(c0->listen_fd);
        c0->listen_fd = -1;
    }
    for (int i = 0; i < g->n && rc == 0; i++) {
        zc_ctx *c = &g->ctx[i];
        rc = zc_set_sock_timeouts(c);
        if (rc == 0 && c->base && c->fd_is_reg && lseek(c->fd, (off_t)c->base, SEEK_SET) < 0)
            rc = zc_fail_errno(c, "lseek of sink %s to the stream's offset %llu", p->sink,
                               (unsigned long long)c->base);
        if (rc == 0 && c->ops->connected)
            rc = c->ops->connected(c);
        if (rc == 0)
            zc_read_sock_info(c);
        if (rc < 0 && c != c0)
            *c0->err = *c->err;
    }
    c0->m.refused_connections = l->refused;
    return rc;
}

int zc_recv_run(const zc_params *p, zc_listener *l, zc_metrics *m, zc_error *err)
{
    memset(m, 0, sizeof *m);
    err->code = 0;
    err->message[0] = '\0';
    zc_group *g = l->state;
    if (!g) {
        err->code = EINVAL;
        snprintf(err->message, sizeof err->message, "recv: the listener was already used or closed");
        return -1;
    }
    zc_ctx *c0 = &g->ctx[0];
    if (recv_accept(g, p, l) < 0) {
        *err = *c0->err;
        zc_listener_close(l);
        return -1;
    }
    int64_t t0 = 0, t1 = 0;
    zc_group_run(g, &t0, &t1);
    int rc = zc_group_error(g, err);
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
        zc_group_totals(g, m, t1 - t0);
        m->fsync_ns = fsync_ns;
        zc_group_stream_metrics(g, p);
    }
    zc_listener_close(l);
    return rc;
}
