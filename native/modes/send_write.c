/* send mode "write": read() the source into a user buffer, write() it to the socket.
 *
 * Source mem: the chunk is already in memory (the fixed pattern ring, see mempattern.c), so the
 * loop is only write(). File or /dev/zero source: one read() of a whole chunk into one reused
 * buffer (part of the mode's cost), then one write() per sub-block.
 */
#include "zc_internal.h"

typedef struct {
    unsigned char *buf;
} priv_t;

static int setup(zc_ctx *c)
{
    if (c->src_mem)
        return 0;
    priv_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    s->buf = zc_alloc(c, c->buffer, "the chunk buffer");
    return s->buf ? 0 : -1;
}

static int transfer(zc_ctx *c)
{
    priv_t *s = c->priv;
    while (c->done < c->total) {
        if (zc_check_deadline(c, "sending") < 0)
            return -1;
        size_t len = zc_min(c->buffer, c->total - c->done);
        const unsigned char *chunk;
        if (c->src_mem) {
            chunk = zc_mem_at(c, c->done);
        } else {
            if (zc_file_read_full(c, s->buf, len) < 0)
                return -1;
            chunk = s->buf;
        }
        for (size_t o = 0; o < len; o += c->sub)
            if (zc_sock_write_all(c, chunk + o, zc_min(c->sub, len - o)) < 0)
                return -1;
    }
    return 0;
}

static void teardown(zc_ctx *c)
{
    priv_t *s = c->priv;
    if (s) {
        zc_free(s->buf, c->buffer);
        zc_free(s, sizeof *s);
        c->priv = NULL;
    }
}

const zc_mode_ops zc_send_write_ops = {
    .name = "write",
    .side = ZC_SIDE_SEND,
    .caps = 0,
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
