/* The send loop of the io_uring send modes (modes/send_io_uring.c, modes/send_io_uring_zc.c).
 * Ordering: io_uring runs independent sends on one socket concurrently, but a TCP stream must leave in order,
 * so each submission is one chain (IOSQE_IO_LINK) of at most --uring-depth sub-blocks with MSG_WAITALL, and the
 * next chain goes once it completed: one io_uring_enter per chain. The socket is a registered file.
 * Buffers: source mem sends from the pattern ring; a file source (or --refill) fills a ring of chunk buffers:
 * --uring-depth + 1 for io_uring (IORING_OP_SEND takes no registered buffers), 2 x --uring-depth for
 * io_uring_zc, registered (IORING_REGISTER_BUFFERS: pinned once) and refilled only after every notification
 * of its sends (IORING_CQE_F_NOTIF); IORING_NOTIF_USAGE_ZC_COPIED counts zc_copied. All notifications are
 * reaped before the timed region ends.
 */
#include "zc_internal.h"
#include "zc_uring.h"

#ifdef ZC_HAVE_IO_URING

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

typedef struct {
    zc_uring ring;
    int ring_ok;
    int zc;
    unsigned depth;
    unsigned nslots;
    unsigned char **slots;  /* own_buffers: chunk buffers */
    uint32_t *notifs;       /* io_uring_zc: notifications outstanding per slot */
    uint64_t notifs_out;    /* io_uring_zc: notifications outstanding in all */
    uint64_t cqes, completed, copied;
} usend_t;

#define SLOT_MEM 0xffffffffu /* user_data slot of a send from the pattern ring */

/* a ring of chunk buffers of our own (a file source, or --refill), else sends straight from the pattern ring */
static int own_buffers(const zc_ctx *c) { return !c->src_mem || c->p->refill; }

static int fail_uring(zc_ctx *c, int neg_errno, const char *what)
{
    errno = -neg_errno;
    if (neg_errno == -ENOMEM && strstr(what, "register"))
        return zc_fail_errno(c, "%s (pinned memory counts against RLIMIT_MEMLOCK: see `ulimit -l`)", what);
    return zc_fail_errno(c, "%s", what);
}

int zc_uring_send_setup(zc_ctx *c, int zc)
{
    usend_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    s->zc = zc;
    s->depth = (unsigned)c->p->uring_depth;
    const char *what = "";
    int rc = zc_uring_init(&s->ring, s->depth, 4 * s->depth < 64 ? 64 : 4 * s->depth, c->shared, &what);
    if (rc < 0)
        return fail_uring(c, rc, what);
    s->ring_ok = 1;
    if (s->ring.sq_entries < s->depth)
        s->depth = s->ring.sq_entries; /* IORING_SETUP_CLAMP: the kernel's maximum */
    if (own_buffers(c)) {
        s->nslots = zc ? 2 * s->depth : s->depth + 1;
        s->slots = zc_alloc(c, s->nslots * sizeof *s->slots, "the buffer ring");
        s->notifs = zc_alloc(c, s->nslots * sizeof *s->notifs, "the buffer ring");
        if (!s->slots || !s->notifs)
            return -1;
        for (unsigned i = 0; i < s->nslots; i++)
            if (!(s->slots[i] = zc_alloc(c, c->buffer, "a ring buffer")))
                return -1;
    }
    if (zc) {
        unsigned n = own_buffers(c) ? s->nslots : 1;
        struct iovec *iov = zc_alloc(c, n * sizeof *iov, "the buffer list");
        if (!iov)
            return -1;
        if (!own_buffers(c)) {
            iov[0].iov_base = c->mem_ring;
            iov[0].iov_len = c->mem_ring_len;
        } else {
            for (unsigned i = 0; i < n; i++) {
                iov[i].iov_base = s->slots[i];
                iov[i].iov_len = c->buffer;
            }
        }
        rc = zc_uring_register(&s->ring, IORING_REGISTER_BUFFERS, iov, n);
        zc_free(iov, n * sizeof *iov);
        if (rc < 0) {
            char what2[96];
            snprintf(what2, sizeof what2, "io_uring_register(IORING_REGISTER_BUFFERS) of %llu bytes",
                     (unsigned long long)(own_buffers(c) ? (uint64_t)n * c->buffer : c->mem_ring_len));
            return fail_uring(c, rc, what2);
        }
    }
    return 0;
}

int zc_uring_send_connected(zc_ctx *c)
{
    usend_t *s = c->priv;
    int fd = c->sock;
    int rc = zc_uring_register(&s->ring, IORING_REGISTER_FILES, &fd, 1);
    return rc < 0 ? fail_uring(c, rc, "io_uring_register(IORING_REGISTER_FILES) of the socket") : 0;
}

/* Reap every CQE there is. Send results: *pending_sends drops; a failure is kept in *first_err
 * (the first one that is not the chain's -ECANCELED aftermath). */
static void reap(usend_t *s, unsigned *pending_sends, int *first_err, uint64_t *sent)
{
    struct io_uring_cqe *cqe;
    while ((cqe = zc_uring_peek(&s->ring))) {
        uint64_t ud = cqe->user_data;
        int res = cqe->res;
        unsigned flags = cqe->flags;
        zc_uring_cqe_seen(&s->ring);
        s->cqes++;
        uint32_t slot = (uint32_t)(ud >> 32), len = (uint32_t)ud;
#ifdef ZC_HAVE_IO_URING_SEND_ZC
        if (flags & IORING_CQE_F_NOTIF) {
            s->completed++;
            if ((uint32_t)res & IORING_NOTIF_USAGE_ZC_COPIED)
                s->copied++;
            s->notifs_out--;
            if (slot != SLOT_MEM)
                s->notifs[slot]--;
            continue;
        }
        if (s->zc && (flags & IORING_CQE_F_MORE)) { /* a notification will follow */
            s->notifs_out++;
            if (slot != SLOT_MEM)
                s->notifs[slot]++;
        }
#endif
        (*pending_sends)--;
        if (res < 0) {
            if (!*first_err || (*first_err == -ECANCELED && res != -ECANCELED))
                *first_err = res;
        } else if ((uint32_t)res != len) {
            if (!*first_err)
                *first_err = -EIO; /* MSG_WAITALL: a short send without an error is not expected */
        } else {
            *sent += (uint64_t)res;
        }
    }
}

/* One wait for io_uring_zc notifications, between chains (no send is in flight then) */
static int wait_notifications(zc_ctx *c, usend_t *s)
{
    unsigned none = 0;
    int err = 0;
    uint64_t sent = 0;
    if (zc_uring_wait(c, &s->ring, "waiting for io_uring zero-copy notifications") < 0)
        return -1;
    reap(s, &none, &err, &sent);
    return 0;
}

int zc_uring_send_transfer(zc_ctx *c)
{
    usend_t *s = c->priv;
    int rc = zc_uring_enable(&s->ring);
    if (rc < 0)
        return fail_uring(c, rc, "enabling the io_uring ring");
    uint64_t queued = 0;      /* bytes put into chains so far */
    size_t chunk_left = 0, chunk_off = 0;
    const unsigned char *chunk = NULL;
    uint32_t slot = SLOT_MEM;
    unsigned next_slot = 0;
    int more;
    while ((more = zc_send_more(c)) > 0) {
        /* one chain of at most `depth` linked sends */
        unsigned n = 0;
        struct io_uring_sqe *last = NULL;
        while (n < s->depth && queued < c->total) {
            if (chunk_left == 0) {
                size_t len = zc_min(c->buffer, c->total - queued);
                if (!own_buffers(c)) {
                    chunk = zc_mem_at(c, queued);
                    slot = SLOT_MEM;
                } else {
                    if (s->notifs[next_slot] && n)
                        break; /* submit what the chain has first: never wait with a chain half built */
                    slot = next_slot;
                    next_slot = (next_slot + 1) % s->nslots;
                    while (s->notifs[slot]) /* io_uring_zc: the kernel may still read this buffer */
                        if (wait_notifications(c, s) < 0)
                            return -1;
                    if (!c->src_mem && zc_file_read_full(c, s->slots[slot], len) < 0)
                        return -1;
                    for (size_t o = 0; c->p->refill && o < len; o += c->sub) /* at stream offset queued + o */
                        zc_refill(c, s->slots[slot] + o, queued + o, zc_min(c->sub, len - o));
                    chunk = s->slots[slot];
                }
                chunk_left = len;
                chunk_off = 0;
            }
            size_t l = zc_min(c->sub, chunk_left);
            struct io_uring_sqe *sqe = zc_uring_get_sqe(&s->ring);
            if (!sqe)
                break; /* cannot happen: the ring holds `depth` entries */
#ifdef ZC_HAVE_IO_URING_SEND_ZC
            if (s->zc) {
                sqe->opcode = IORING_OP_SEND_ZC;
                sqe->ioprio = IORING_RECVSEND_FIXED_BUF | IORING_SEND_ZC_REPORT_USAGE;
                sqe->buf_index = (uint16_t)(slot == SLOT_MEM ? 0 : slot);
            } else
#endif
            {
                sqe->opcode = IORING_OP_SEND;
            }
            sqe->fd = 0; /* the registered socket */
            sqe->flags = IOSQE_FIXED_FILE | IOSQE_IO_LINK;
            sqe->addr = (uint64_t)(uintptr_t)(chunk + chunk_off);
            sqe->len = (uint32_t)l;
            sqe->msg_flags = MSG_WAITALL | MSG_NOSIGNAL;
            sqe->user_data = (uint64_t)slot << 32 | (uint32_t)l;
            last = sqe;
            chunk_off += l;
            chunk_left -= l;
            queued += l;
            n++;
        }
        if (last)
            last->flags &= (uint8_t)~IOSQE_IO_LINK; /* the chain ends here */
        unsigned pending = n;
        int err = 0;
        uint64_t sent = 0;
        while (pending) {
            if (zc_uring_wait(c, &s->ring, "sending with io_uring") < 0)
                return -1;
            reap(s, &pending, &err, &sent);
        }
        c->done += sent;
        if (err) {
            errno = -err;
            if (err == -EIO)
                return zc_fail(c, EIO, "a send completed short although MSG_WAITALL was set (bug?)");
            return zc_fail_errno(c, "%s on the socket", s->zc ? "IORING_OP_SEND_ZC" : "IORING_OP_SEND");
        }
    }
    if (more < 0)
        return -1;
    while (s->notifs_out)
        if (wait_notifications(c, s) < 0)
            return -1;
    c->m.uring_cqes = (int64_t)s->cqes;
    if (s->zc) {
        c->m.zc_completions = (int64_t)s->completed;
        c->m.zc_copied = (int64_t)s->copied;
    }
    return 0;
}

void zc_uring_send_teardown(zc_ctx *c)
{
    usend_t *s = c->priv;
    if (!s)
        return;
    if (s->ring_ok)
        zc_uring_exit(&s->ring); /* cancels what is in flight; the kernel keeps pinned pages alive */
    if (s->slots) {
        for (unsigned i = 0; i < s->nslots; i++)
            zc_free(s->slots[i], c->buffer);
        zc_free(s->slots, s->nslots * sizeof *s->slots);
    }
    zc_free(s->notifs, s->nslots * sizeof *s->notifs);
    zc_free(s, sizeof *s);
    c->priv = NULL;
}

#endif /* ZC_HAVE_IO_URING */
