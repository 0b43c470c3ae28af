/* send mode "vmsplice": user memory -> vmsplice() -> pipe -> splice() -> socket, one pair per
 * sub-block (or pipe-full); --gift adds SPLICE_F_GIFT to vmsplice.
 *
 * vmsplice hands the kernel references to our pages, which the pipe, the socket's write queue and
 * (on loopback) the receiver's queue may hold long after the call returns; nothing tells us when
 * they are released. So a page is never written again once spliced:
 *  - source mem without --gift: the chunks come straight from the fixed pattern ring, which is
 *    filled once and never rewritten;
 *  - source mem with --gift, and any file source (/dev/zero too): a fresh anonymous mapping per
 *    chunk, filled (pattern, or one read() of the chunk: part of this mode's cost), spliced, and
 *    unmapped; munmap drops only our reference, so in-flight pages stay intact (as in the
 *    splice-write-benchmark seed: "the new buffer is mmap-ed on each iteration").
 */
#include "zc_internal.h"

static int fresh_buffers(const zc_ctx *c) { return !c->src_mem || c->p->gift; }

static int setup(zc_ctx *c) { return zc_open_pipe(c); }

static int transfer(zc_ctx *c)
{
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        unsigned char *fresh = NULL;
        const unsigned char *chunk;
        if (!fresh_buffers(c)) {
            chunk = zc_mem_at(c, c->done);
        } else {
            fresh = zc_alloc(c, len, "a fresh chunk buffer");
            if (!fresh)
                return -1;
            if (c->src_mem)
                zc_mem_pattern(c->base + c->done, fresh, len);
            else if (zc_file_read_full(c, fresh, len) < 0) {
                zc_free(fresh, len);
                return -1;
            }
            chunk = fresh;
        }
        int rc = 0;
        for (size_t o = 0; o < len && rc == 0; o += c->sub)
            rc = zc_vmsplice_out(c, chunk + o, zc_min(c->sub, len - o), c->sock, NULL);
        zc_free(fresh, len);
        if (rc < 0)
            return -1;
    }
    if (more < 0)
        return -1;
    return 0;
}

static void teardown(zc_ctx *c) { (void)c; }

const zc_mode_ops zc_send_vmsplice_ops = {
    .name = "vmsplice",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_PIPE | ZC_CAP_GIFT,
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
