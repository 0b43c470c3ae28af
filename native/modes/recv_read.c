/* recv mode "read": read() up to one sub-block from the socket into one buffer (never more than --bytes
 * still expects), write() what arrived to the sink. */
#include "zc_internal.h"

static int setup(zc_ctx *c)
{
    return zc_buf_state_new(c, "the receive buffer");
}

static int transfer(zc_ctx *c)
{
    zc_buf_state *s = c->priv;
    for (;;) {
        if (zc_check_deadline(c, "receiving") < 0)
            return -1;
        size_t want = zc_recv_want(c, c->sub);
        if (want == 0)
            return 0;
        ssize_t n = zc_sock_read(c, s->buf, want);
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (zc_file_write_all(c, s->buf, (size_t)n) < 0)
            return -1;
        c->done += (uint64_t)n;
    }
}

const zc_mode_ops zc_recv_read_ops = {
    .name = "read",
    .side = ZC_SIDE_RECV,
    .setup = setup,
    .transfer = transfer,
    .teardown = zc_buf_state_free,
};
