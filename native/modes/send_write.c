/* send mode "write": write() each sub-block to the socket. Source mem sends from the pattern ring (with
 * --refill each sub-block is first written anew into one buffer: zc_refill); a file source is read() a chunk
 * at a time into one buffer (part of the mode's cost).
 */
#include "zc_internal.h"

static int setup(zc_ctx *c)
{
    return c->src_mem && !c->p->refill ? 0 : zc_buf_state_new(c, "the chunk buffer");
}

static int transfer(zc_ctx *c)
{
    zc_buf_state *s = c->priv;
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        const unsigned char *chunk;
        if (c->src_mem && !c->p->refill) {
            chunk = zc_mem_at(c, c->done);
        } else if (c->src_mem) {
            chunk = s->buf;
        } else {
            if (zc_file_read_full(c, s->buf, len) < 0)
                return -1;
            chunk = s->buf;
        }
        for (size_t o = 0; o < len; o += c->sub) {
            size_t l = zc_min(c->sub, len - o);
            if (c->p->refill)   /* c->done is the stream offset of this sub-block */
                zc_refill(c, s->buf + o, c->done, l);
            if (zc_sock_write_all(c, chunk + o, l) < 0)
                return -1;
        }
    }
    return more; /* 0: done, -1: failed */
}

const zc_mode_ops zc_send_write_ops = {
    .name = "write",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_REFILL,
    .setup = setup,
    .transfer = transfer,
    .teardown = zc_buf_state_free,
};
