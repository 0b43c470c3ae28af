/* The run flow shared by every mode and every stream count: validate, open the source/sink, the mode's
 * setup, connect or listen and accept within the deadline, then the timed transfers (group.c, stream.c)
 * and the group's totals (totals.c). One stream is a group of one and takes the same path; only a group
 * of several exchanges stream hellos (net.c) so the receiver knows which slice a connection carries.
 * Everything untimed (allocation, sink preparation, connection set-up, the final handshakes) stays
 * outside wall_ns; the receiver's fsync (--fsync) is inside it, once after every stream.
 */
#include "zc_core.h"

#include <errno.h>
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
        if (rc == 0 && c->src_mem && i > 0) { /* one pattern ring for the group: read-only once filled, so
                                                * the streams share it (one cache footprint, not one each) */
            c->mem_ring = g->ctx[0].mem_ring;
            c->mem_ring_len = g->ctx[0].mem_ring_len;
            c->mem_ring_borrowed = 1;
        }
        if (rc == 0)
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
        if (rc == 0 && g->n > 1)
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

/* Receiver set-up: stream 0 prepares the sink (fresh, preallocated, overwritten) and listens; the
 * others open the prepared sink again, each with its own offset. The listener holds the group. */
int zc_recv_listen(const zc_params *p, zc_listener *out, zc_error *err)
{
    out->port = 0;
    out->state = NULL;
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
        if (rc == 0)
            rc = c->ops->setup(c);
    }
    if (rc == 0)
        rc = zc_listen(c0, g->n, &out->port);
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

/* One accepted connection: with several streams, its hello says which stream it is and which slice it
 * carries (checked against the receiver's own --streams and --bytes); a group of one has no hello. */
static int adopt_connection(zc_group *g, int fd)
{
    zc_ctx *c0 = &g->ctx[0];
    if (g->n == 1) {
        c0->sock = fd;
        return 0;
    }
    unsigned char b[ZC_HELLO_LEN];
    if (zc_read_hello(c0, fd, b) < 0)
        return -1;
    uint32_t idx, cnt;
    uint64_t off, len;
    if (zc_parse_hello(b, &idx, &cnt, &off, &len) < 0)
        return zc_fail(c0, EPROTO, "a connection did not start with a stream hello (is the sender running "
                                   "--streams %d too?)", g->n);
    if ((int)cnt != g->n || idx >= cnt)
        return zc_fail(c0, EPROTO, "the sender runs %u streams (this stream %u), the receiver --streams %d",
                       cnt, idx, g->n);
    if (g->ctx[idx].sock >= 0)
        return zc_fail(c0, EPROTO, "two connections claim stream %u", idx);
    zc_ctx *c = &g->ctx[idx];
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
    return 0;
}

/* Receiver, untimed: accept every stream's connection within the deadline and ready it. */
static int recv_accept(zc_group *g, const zc_params *p)
{
    zc_ctx *c0 = &g->ctx[0];
    const char *waiting = g->n == 1 ? "waiting for the sender to connect"
                                    : "waiting for the senders' streams to connect";
    int rc = 0;
    for (int k = 0; k < g->n && rc == 0; k++) {
        rc = zc_poll_deadline(c0, c0->listen_fd, POLLIN, waiting);
        int fd = rc == 0 ? accept4(c0->listen_fd, NULL, NULL, SOCK_CLOEXEC) : -1;
        if (rc == 0 && fd < 0)
            rc = zc_fail_errno(c0, "accept");
        if (rc == 0 && (rc = adopt_connection(g, fd)) == 0)
            fd = -1;
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
    if (recv_accept(g, p) < 0) {
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
