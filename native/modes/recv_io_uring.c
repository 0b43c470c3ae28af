/* recv mode "io_uring": one multishot IORING_OP_RECV on the registered socket, taking buffers of one
 * sub-block from a provided buffer ring of --uring-depth (rounded up to a power of two); each completion's
 * data is write()n to the sink and its buffers go straight back. Bundles (IORING_RECVSEND_BUNDLE, Linux 6.10+)
 * are used where the kernel has them (uring_bundle 1/0). An ended multishot receive is re-armed; with --bytes,
 * once every byte is in it is cancelled and more data is EPROTO. Needs Linux 6.0+: available() probes it.
 */
#include "zc_internal.h"
#include "zc_uring.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(ZC_HAVE_IO_URING) && defined(ZC_HAVE_IO_URING_PBUF_RING)

#include <sys/mman.h>

/* kernel ABI: older headers still let a newer kernel use bundles (IORING_FEAT_RECVSEND_BUNDLE says) */
#ifndef IORING_RECVSEND_BUNDLE
#define IORING_RECVSEND_BUNDLE (1U << 4)
#endif
#ifndef IORING_FEAT_RECVSEND_BUNDLE
#define IORING_FEAT_RECVSEND_BUNDLE (1U << 14)
#endif

#define BGID 7
#define UD_RECV 1
#define UD_CANCEL 2

typedef struct {
    zc_uring ring;
    int ring_ok;
    int bundle;
    unsigned nbufs, mask;
    size_t buflen;
    unsigned char *bufs;         /* nbufs x buflen */
    struct io_uring_buf_ring *br;
    size_t br_len;
    int br_registered;
    uint16_t *ring_bid;          /* which buffer sits in each ring entry */
    unsigned tail, cons;         /* our producer tail; entries the kernel consumed */
    uint64_t cqes;
} urecv_t;

static int fail_uring(zc_ctx *c, int neg_errno, const char *what)
{
    errno = -neg_errno;
    return zc_fail_errno(c, "%s", what);
}

static int register_buf_ring(zc_uring *r, struct io_uring_buf_ring *br, unsigned entries)
{
    struct io_uring_buf_reg reg;
    memset(&reg, 0, sizeof reg);
    reg.ring_addr = (uint64_t)(uintptr_t)br;
    reg.ring_entries = entries;
    reg.bgid = BGID;
    return zc_uring_register(r, IORING_REGISTER_PBUF_RING, &reg, 1);
}

static void prep_recv(struct io_uring_sqe *sqe, int fd, int bundle, int fixed)
{
    sqe->opcode = IORING_OP_RECV;
    sqe->fd = fd;
    sqe->flags = IOSQE_BUFFER_SELECT | (fixed ? IOSQE_FIXED_FILE : 0);
    sqe->buf_group = BGID;
    sqe->ioprio = IORING_RECV_MULTISHOT | (bundle ? IORING_RECVSEND_BUNDLE : 0);
    sqe->user_data = UD_RECV;
}

static void prep_probe(struct io_uring_sqe *sqe, int fd) { prep_recv(sqe, fd, 0, 0); }

static int available(char *why, size_t len)
{
    zc_uring r;
    if (!zc_uring_probe_ring(&r, why, len))
        return 0;
    static const int ops[] = {IORING_OP_RECV, IORING_OP_ASYNC_CANCEL};
    int missing = zc_uring_first_unsupported(&r, ops, 2);
    int ok = 0;
    void *mem = MAP_FAILED;
    if (missing == -2) {
        snprintf(why, len, "the kernel's io_uring cannot be probed (IORING_REGISTER_PROBE, Linux 5.6 or later)");
    } else if (missing >= 0) {
        snprintf(why, len, "the kernel's io_uring has no IORING_OP_RECV (Linux 5.6 or later)");
    } else {
        mem = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int rc = mem == MAP_FAILED ? -ENOMEM : register_buf_ring(&r, mem, 4);
        if (rc < 0)
            snprintf(why, len, "the kernel refuses a provided buffer ring (IORING_REGISTER_PBUF_RING, Linux 5.19 or "
                               "later): %s", strerror(-rc));
        else if ((ok = zc_uring_flags_accepted(&r, prep_probe)) == 0)
            snprintf(why, len, "the kernel refuses a multishot IORING_OP_RECV (IORING_RECV_MULTISHOT, Linux 6.0 or "
                               "later)");
        else if (ok < 0)
            snprintf(why, len, "probing the multishot receive failed: %s", strerror(-ok));
    }
    zc_uring_exit(&r);
    if (mem != MAP_FAILED)
        munmap(mem, 4096);
    return ok == 1;
}

static int setup(zc_ctx *c)
{
    urecv_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    unsigned want = (unsigned)c->p->uring_depth, n = 2;
    while (n < want && n < 32768)
        n <<= 1;
    s->nbufs = n;
    s->mask = n - 1;
    s->buflen = c->sub;
    const char *what = "";
    int rc = zc_uring_init(&s->ring, 8, 64, c->shared, &what);
    if (rc < 0)
        return fail_uring(c, rc, what);
    s->ring_ok = 1;
    s->bundle = (s->ring.features & IORING_FEAT_RECVSEND_BUNDLE) != 0;
    s->bufs = zc_alloc(c, (size_t)n * s->buflen, "the provided buffers");
    s->br_len = (size_t)n * sizeof(struct io_uring_buf);
    s->br = zc_alloc(c, s->br_len, "the provided buffer ring");
    s->ring_bid = zc_alloc(c, n * sizeof *s->ring_bid, "the provided buffer ring");
    if (!s->bufs || !s->br || !s->ring_bid)
        return -1;
    rc = register_buf_ring(&s->ring, s->br, n);
    if (rc < 0)
        return fail_uring(c, rc, "io_uring_register(IORING_REGISTER_PBUF_RING)");
    s->br_registered = 1;
    for (unsigned i = 0; i < n; i++) { /* every buffer into the ring, in buffer-id order */
        struct io_uring_buf *b = &s->br->bufs[i];
        b->addr = (uint64_t)(uintptr_t)(s->bufs + (size_t)i * s->buflen);
        b->len = (uint32_t)s->buflen;
        b->bid = (uint16_t)i;
        s->ring_bid[i] = (uint16_t)i;
    }
    s->tail = n;
    __atomic_store_n(&s->br->tail, (uint16_t)s->tail, __ATOMIC_RELEASE);
    return 0;
}

static int connected(zc_ctx *c)
{
    urecv_t *s = c->priv;
    int fd = c->sock;
    int rc = zc_uring_register(&s->ring, IORING_REGISTER_FILES, &fd, 1);
    return rc < 0 ? fail_uring(c, rc, "io_uring_register(IORING_REGISTER_FILES) of the socket") : 0;
}

static int arm(zc_ctx *c, urecv_t *s)
{
    struct io_uring_sqe *sqe = zc_uring_get_sqe(&s->ring);
    if (!sqe)
        return zc_fail(c, EBUSY, "the io_uring submission queue is full (bug)");
    prep_recv(sqe, 0, s->bundle, 1);
    return 0;
}

/* Hand a consumed buffer back to the kernel (published by consume()). */
static void give_back(urecv_t *s, uint16_t bid)
{
    struct io_uring_buf *b = &s->br->bufs[s->tail & s->mask];
    b->addr = (uint64_t)(uintptr_t)(s->bufs + (size_t)bid * s->buflen);
    b->len = (uint32_t)s->buflen;
    b->bid = bid;
    s->ring_bid[s->tail & s->mask] = bid;
    s->tail++;
}

/* The data of one receive completion: res bytes in the buffers from the ring's consumer position on. */
static int consume(zc_ctx *c, urecv_t *s, int res, unsigned flags)
{
    if (!(flags & IORING_CQE_F_BUFFER))
        return zc_fail(c, EPROTO, "a receive completion with data but no buffer (bug)");
    uint16_t bid = (uint16_t)(flags >> IORING_CQE_BUFFER_SHIFT);
    if (bid != s->ring_bid[s->cons & s->mask])
        return zc_fail(c, EPROTO, "the kernel used buffer %u where buffer %u was next (bug)", bid,
                       s->ring_bid[s->cons & s->mask]);
    if (c->total_known && c->done + (uint64_t)res > c->total)
        return zc_fail(c, EPROTO, "the sender sent more than --bytes %llu", (unsigned long long)c->total);
    size_t left = (size_t)res;
    while (left) {
        uint16_t b = s->ring_bid[s->cons & s->mask];
        size_t l = zc_min(s->buflen, left);
        if (zc_file_write_all(c, s->bufs + (size_t)b * s->buflen, l) < 0)
            return -1;
        c->done += l;
        left -= l;
        s->cons++;
        give_back(s, b);
    }
    __atomic_store_n(&s->br->tail, (uint16_t)s->tail, __ATOMIC_RELEASE); /* publish them */
    return 0;
}

static int transfer(zc_ctx *c)
{
    urecv_t *s = c->priv;
    int rc = zc_uring_enable(&s->ring);
    if (rc < 0)
        return fail_uring(c, rc, "enabling the io_uring ring");
    c->m.uring_bundle = s->bundle;
    if (c->total_known && c->total == 0)
        return 0;
    if (arm(c, s) < 0)
        return -1;
    int armed = 1, cancelling = 0, eof = 0;
    while (armed) {
        if (zc_uring_wait(c, &s->ring, "receiving") < 0)
            return -1;
        struct io_uring_cqe *cqe;
        while ((cqe = zc_uring_peek(&s->ring))) {
            uint64_t ud = cqe->user_data;
            int res = cqe->res;
            unsigned flags = cqe->flags;
            zc_uring_cqe_seen(&s->ring);
            s->cqes++;
            if (ud != UD_RECV)
                continue; /* the cancel request's own completion */
            if (res > 0 && consume(c, s, res, flags) < 0)
                return -1;
            if (flags & IORING_CQE_F_MORE)
                continue;
            armed = 0; /* this multishot receive is over */
            if (res == 0) {
                eof = 1;
            } else if (res < 0 && res != -ENOBUFS && !(cancelling && res == -ECANCELED)) {
                errno = -res;
                return zc_fail_errno(c, "multishot IORING_OP_RECV");
            }
        }
        int complete = c->total_known && c->done >= c->total;
        if (!armed && !eof && !complete && !cancelling) { /* ran out of buffers, or ended: go on */
            if (arm(c, s) < 0)
                return -1;
            armed = 1;
        }
        if (armed && complete && !cancelling) {
            /* every expected byte is in: stop the receive; what it still brings is too much */
            struct io_uring_sqe *sqe = zc_uring_get_sqe(&s->ring);
            if (!sqe)
                return zc_fail(c, EBUSY, "the io_uring submission queue is full (bug)");
            sqe->opcode = IORING_OP_ASYNC_CANCEL;
            sqe->addr = UD_RECV;
            sqe->user_data = UD_CANCEL;
            cancelling = 1;
        }
    }
    c->m.uring_cqes = (int64_t)s->cqes;
    return 0;
}

static void teardown(zc_ctx *c)
{
    urecv_t *s = c->priv;
    if (!s)
        return;
    if (s->ring_ok)
        zc_uring_exit(&s->ring);
    zc_free(s->bufs, (size_t)s->nbufs * s->buflen);
    zc_free(s->br, s->br_len);
    zc_free(s->ring_bid, s->nbufs * sizeof *s->ring_bid);
    zc_free(s, sizeof *s);
    c->priv = NULL;
}

const zc_mode_ops zc_recv_io_uring_ops = {
    .name = "io_uring",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING,
    .available = available,
    .setup = setup,
    .connected = connected,
    .transfer = transfer,
    .teardown = teardown,
};

#else /* built without provided buffer rings in <linux/io_uring.h>: listed, never run */

ZC_UNBUILT_MODE(zc_recv_io_uring_ops, "io_uring", ZC_SIDE_RECV, ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING, "io_uring",
                "io_uring_pbuf_ring");

#endif
