/* send mode "msg_zerocopy": send(MSG_ZEROCOPY) on a SO_ZEROCOPY socket; each call's completion is reaped
 * from the error queue (recvmsg(MSG_ERRQUEUE)): zc_completions counts them, zc_copied those marked
 * SO_EE_CODE_ZEROCOPY_COPIED. A page sent must not be rewritten before its completion: source mem sends from
 * the never-rewritten pattern ring; a file source or --refill fills a ring of chunk buffers, each refilled
 * only once none of its sends is outstanding. All completions are reaped before the timed region ends.
 */
#include "zc_internal.h"

#include <errno.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif
#ifndef SO_EE_ORIGIN_ZEROCOPY
#define SO_EE_ORIGIN_ZEROCOPY 5
#endif
#ifndef SO_EE_CODE_ZEROCOPY_COPIED
#define SO_EE_CODE_ZEROCOPY_COPIED 1
#endif

#define MAX_OUTSTANDING 4096u /* sends in flight that we track (ids modulo this) */
#define RING_BYTES (4u << 20)  /* file source: about this much memory in flight */

typedef struct {
    unsigned char **slots; /* file source: chunk buffers */
    size_t nslots;
    uint32_t *busy;        /* outstanding sends per slot */
    uint32_t slot_of[MAX_OUTSTANDING];
    uint32_t next_id;      /* ids issued so far (the kernel numbers successful calls from 0) */
    uint64_t completed;
    uint64_t copied;
} priv_t;

/* SO_ZEROCOPY (Linux 4.14+, and a kernel may lack it) tried on a throw-away TCP socket */
static int available(char *why, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, len, "cannot open a TCP socket to probe SO_ZEROCOPY: %s", strerror(errno));
        return 0;
    }
    int one = 1;
    int ok = setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) == 0;
    int code = errno;
    close(fd);
    if (!ok)
        snprintf(why, len, "the kernel refuses setsockopt(SO_ZEROCOPY): %s (MSG_ZEROCOPY needs Linux 4.14 or later)",
                 strerror(code));
    return ok;
}

static int setup(zc_ctx *c)
{
    priv_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    if (c->src_mem && !c->p->refill)
        return 0;
    size_t n = RING_BYTES / c->buffer;
    s->nslots = n < 4 ? 4 : n > 64 ? 64 : n;
    s->slots = zc_alloc(c, s->nslots * sizeof *s->slots, "the buffer ring");
    s->busy = zc_alloc(c, s->nslots * sizeof *s->busy, "the buffer ring");
    if (!s->slots || !s->busy)
        return -1;
    for (size_t i = 0; i < s->nslots; i++)
        if (!(s->slots[i] = zc_alloc(c, c->buffer, "a ring buffer")))
            return -1;
    return 0;
}

static int outstanding(const priv_t *s) { return s->completed < s->next_id; }

/* Drain the error queue; with `block`, first wait (within the deadline) until something is there. */
static int reap(zc_ctx *c, priv_t *s, int block)
{
    for (;;) {
        char control[256];
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        if (recvmsg(c->sock, &msg, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                return zc_fail_errno(c, "recvmsg(MSG_ERRQUEUE)");
            if (!block)
                return 0;
            int revents = zc_wait_fd(c, c->sock, 0, "waiting for MSG_ZEROCOPY completions");
            if (revents < 0)
                return -1;
            if (revents & (POLLERR | POLLHUP)) {
                /* POLLERR also means "error queue not empty": only a pending socket error or a hang-up
                 * (with nothing queued, as recvmsg just said) ends the wait, instead of spinning */
                int soerr = 0;
                socklen_t sl = sizeof soerr;
                if (getsockopt(c->sock, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr) {
                    errno = soerr;
                    return zc_fail_errno(c, "waiting for MSG_ZEROCOPY completions");
                }
                if (revents & POLLHUP) {
                    errno = ECONNRESET;
                    return zc_fail_errno(c, "waiting for MSG_ZEROCOPY completions");
                }
            }
            continue;
        }
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
            if (!((cm->cmsg_level == SOL_IP && cm->cmsg_type == IP_RECVERR) ||
                  (cm->cmsg_level == SOL_IPV6 && cm->cmsg_type == IPV6_RECVERR)))
                continue;
            struct sock_extended_err *ee = (struct sock_extended_err *)CMSG_DATA(cm);
            if (ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY || ee->ee_errno != 0) {
                errno = ee->ee_errno ? (int)ee->ee_errno : EIO;
                return zc_fail_errno(c, "error queue reported origin %u", ee->ee_origin);
            }
            uint32_t n = ee->ee_data - ee->ee_info + 1;
            s->completed += n;
            if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED)
                s->copied += n;
            if (s->busy)
                for (uint32_t id = ee->ee_info; id != ee->ee_data + 1; id++)
                    s->busy[s->slot_of[id % MAX_OUTSTANDING]]--;
        }
        block = 0;
    }
}

static int send_zc(zc_ctx *c, priv_t *s, const unsigned char *p, size_t len, uint32_t slot)
{
    while (len) {
        while (s->next_id - s->completed >= MAX_OUTSTANDING - 1)
            if (reap(c, s, 1) < 0)
                return -1;
        ssize_t n = send(c->sock, p, len, MSG_ZEROCOPY | MSG_NOSIGNAL);
        if (n > 0) {
            s->slot_of[s->next_id % MAX_OUTSTANDING] = slot;
            if (s->busy)
                s->busy[slot]++;
            s->next_id++;
            p += n;
            len -= (size_t)n;
            c->done += (uint64_t)n;
            if ((s->next_id & 31) == 0 && reap(c, s, 0) < 0) /* keep the error queue short */
                return -1;
            continue;
        }
        int again = n < 0 ? zc_io_retry(c, "sending with MSG_ZEROCOPY", NULL) : 0;
        if (again < 0)
            return -1;
        if (again)
            continue;
        if (n < 0 && errno == ENOBUFS && outstanding(s)) {
            /* optmem_max exhausted by pending notifications: reap some and retry */
            if (reap(c, s, 1) < 0)
                return -1;
        } else {
            return zc_fail_errno(c, "send with MSG_ZEROCOPY");
        }
    }
    return 0;
}

static int transfer(zc_ctx *c)
{
    priv_t *s = c->priv;
    int one = 1;
    if (setsockopt(c->sock, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) < 0)
        return zc_fail_errno(c, "the kernel refused setsockopt(SO_ZEROCOPY)");
    uint64_t chunk_no = 0;
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        const unsigned char *chunk;
        uint32_t slot = 0;
        if (c->src_mem && !c->p->refill) {
            chunk = zc_mem_at(c, c->done);
        } else {
            slot = (uint32_t)(chunk_no % s->nslots);
            while (s->busy[slot])
                if (reap(c, s, 1) < 0)
                    return -1;
            if (!c->src_mem && zc_file_read_full(c, s->slots[slot], len) < 0)
                return -1;
            chunk = s->slots[slot];
        }
        for (size_t o = 0; o < len; o += c->sub) {
            size_t l = zc_min(c->sub, len - o);
            if (c->p->refill)   /* c->done is the stream offset of this sub-block */
                zc_refill(c, s->slots[slot] + o, c->done, l);
            if (send_zc(c, s, chunk + o, l, slot) < 0)
                return -1;
        }
        chunk_no++;
    }
    if (more < 0)
        return -1;
    while (outstanding(s))
        if (reap(c, s, 1) < 0)
            return -1;
    c->m.zc_completions = (int64_t)s->completed;
    c->m.zc_copied = (int64_t)s->copied;
    return 0;
}

static void teardown(zc_ctx *c)
{
    priv_t *s = c->priv;
    if (!s)
        return;
    if (s->slots) {
        for (size_t i = 0; i < s->nslots; i++)
            zc_free(s->slots[i], c->buffer);
        zc_free(s->slots, s->nslots * sizeof *s->slots);
    }
    zc_free(s->busy, s->nslots * sizeof *s->busy);
    zc_free(s, sizeof *s);
    c->priv = NULL;
}

const zc_mode_ops zc_send_msg_zerocopy_ops = {
    .name = "msg_zerocopy",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_ZC_COMPLETIONS | ZC_CAP_KERNEL_FEATURE | ZC_CAP_REFILL,
    .available = available,
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
