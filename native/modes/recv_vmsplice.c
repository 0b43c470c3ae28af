/* recv mode "vmsplice": read() into a user buffer, vmsplice() it into a pipe, splice() pipe -> sink; --gift
 * adds SPLICE_F_GIFT. Two buffers alternate; a buffer is free again once its pipe contents were spliced out
 * (splicing into a file copies into the page cache before it returns).
 */
#include "zc_internal.h"

typedef struct {
    unsigned char *buf[2];
} priv_t;

static int setup(zc_ctx *c)
{
    priv_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    for (int i = 0; i < 2; i++)
        if (!(s->buf[i] = zc_alloc(c, c->buffer, "a receive buffer")))
            return -1;
    return zc_open_pipe(c, c->sub);
}

static int transfer(zc_ctx *c)
{
    priv_t *s = c->priv;
    for (int i = 0;; i ^= 1) {
        if (zc_check_deadline(c, "receiving") < 0)
            return -1;
        size_t want = zc_recv_want(c, c->sub);
        if (want == 0)
            return 0;
        ssize_t n = zc_sock_read(c, s->buf[i], want);
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (zc_vmsplice_out(c, s->buf[i], (size_t)n, c->fd, NULL) < 0)
            return -1;
        c->done += (uint64_t)n;
    }
}

static void teardown(zc_ctx *c)
{
    priv_t *s = c->priv;
    if (s) {
        for (int i = 0; i < 2; i++)
            zc_free(s->buf[i], c->buffer);
        zc_free(s, sizeof *s);
        c->priv = NULL;
    }
}

const zc_mode_ops zc_recv_vmsplice_ops = {
    .name = "vmsplice",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_PIPE | ZC_CAP_GIFT,
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
