/* send mode "vmsplice": user memory -> vmsplice() -> pipe -> splice() -> socket; --gift adds SPLICE_F_GIFT.
 * The pipe and socket may hold references to vmspliced pages long after the call, and nothing says when they
 * are released, so a page is never written again once spliced: source mem without --gift sends from the
 * never-rewritten pattern ring; otherwise each chunk is a fresh mapping, filled, spliced and unmapped
 * (munmap drops only our reference), as the splice-write-benchmark does.
 * --mmap-grain whole/subblock: one mapping per buffer or per sub-block (fresh buffers only); --splice-grain
 * subblock/whole: one vmsplice+splice pair per sub-block, or per buffer with every sub-block's iovec (the
 * benchmark's LARGE_MMAP and LARGE_VECIO).
 */
#include "zc_internal.h"

#include <limits.h>
#include <sys/uio.h>

#define BATCH IOV_MAX   /* sub-blocks handled together: the iovecs one vmsplice() takes at most */

typedef struct {
    struct iovec iov[BATCH];
    unsigned char *map[BATCH];   /* --mmap-grain subblock: each sub-block's own mapping */
    size_t map_len[BATCH];
} vms_state;

static int fresh_buffers(const zc_ctx *c) { return !c->src_mem || c->p->gift; }
static int splice_whole(const zc_ctx *c) { return c->p->splice_grain == ZC_SPLICE_GRAIN_WHOLE; }
static int map_per_sub(const zc_ctx *c) { return fresh_buffers(c) && c->p->mmap_grain == ZC_MMAP_GRAIN_SUBBLOCK; }

static int setup(zc_ctx *c)
{
    if (!zc_priv_new(c, sizeof(vms_state)))
        return -1;
    return zc_open_pipe(c, splice_whole(c) ? c->buffer : c->sub);
}

/* dst gets the source's bytes at stream offset off */
static int fill(zc_ctx *c, unsigned char *dst, uint64_t off, size_t len)
{
    if (c->src_mem) {
        zc_mem_fill(c, dst, off, len);
        return 0;
    }
    return zc_file_read_full(c, dst, len);
}

static int splice_out(zc_ctx *c, struct iovec *iov, size_t n)
{
    if (splice_whole(c))
        return zc_vmsplice_iov_out(c, iov, n, c->sock, NULL);
    for (size_t i = 0; i < n; i++)
        if (zc_vmsplice_iov_out(c, &iov[i], 1, c->sock, NULL) < 0)
            return -1;
    return 0;
}

/* One buffer in one mapping (fresh) or in the ring: its sub-blocks are slices of it. */
static int send_contiguous(zc_ctx *c, size_t len)
{
    vms_state *s = c->priv;
    uint64_t off = c->done;
    unsigned char *fresh = NULL;
    const unsigned char *chunk;
    if (!fresh_buffers(c)) {
        chunk = zc_mem_at(c, off);
    } else {
        if (!(fresh = zc_alloc(c, len, "a fresh chunk buffer")))
            return -1;
        if (fill(c, fresh, off, len) < 0) {
            zc_free(fresh, len);
            return -1;
        }
        chunk = fresh;
    }
    int rc = 0;
    if (splice_whole(c)) {
        rc = zc_vmsplice_out(c, chunk, len, c->sock, NULL);
    } else {
        for (size_t o = 0; o < len && rc == 0;) {
            size_t n = 0;
            for (; n < BATCH && o < len; n++, o += c->sub)
                s->iov[n] = (struct iovec){.iov_base = (void *)(chunk + o), .iov_len = zc_min(c->sub, len - o)};
            rc = splice_out(c, s->iov, n);
        }
    }
    zc_free(fresh, len);
    return rc;
}

/* One buffer as one mapping per sub-block, BATCH sub-blocks at a time: map and fill each, splice, unmap. */
static int send_mapped_subblocks(zc_ctx *c, size_t len)
{
    vms_state *s = c->priv;
    uint64_t off = c->done;
    int rc = 0;
    for (size_t o = 0; o < len && rc == 0;) {
        size_t n = 0;
        for (; n < BATCH && o < len && rc == 0; o += c->sub) {
            size_t l = zc_min(c->sub, len - o);
            unsigned char *p = zc_alloc(c, l, "a fresh sub-block buffer");
            if (!p) {
                rc = -1;
                break;
            }
            s->map[n] = p;
            s->map_len[n] = l;
            s->iov[n++] = (struct iovec){.iov_base = p, .iov_len = l};
            rc = fill(c, p, off + o, l);
        }
        if (rc == 0)
            rc = splice_out(c, s->iov, n);
        for (size_t i = 0; i < n; i++)
            zc_free(s->map[i], s->map_len[i]);
    }
    return rc;
}

static int transfer(zc_ctx *c)
{
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        if ((map_per_sub(c) ? send_mapped_subblocks(c, len) : send_contiguous(c, len)) < 0)
            return -1;
    }
    return more; /* 0: done, -1: failed */
}

static void teardown(zc_ctx *c)
{
    zc_free(c->priv, sizeof(vms_state));
    c->priv = NULL;
}

const zc_mode_ops zc_send_vmsplice_ops = {
    .name = "vmsplice",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_PIPE | ZC_CAP_GIFT | ZC_CAP_GRAIN,
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
