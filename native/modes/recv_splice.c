/* recv mode "splice": splice() socket -> pipe (at most a sub-block and a pipe-full), then pipe -> sink. */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>

static int setup(zc_ctx *c) { return zc_open_pipe(c, c->sub); }

static int transfer(zc_ctx *c)
{
    for (;;) {
        if (zc_check_deadline(c, "receiving") < 0)
            return -1;
        size_t want = zc_recv_want(c, zc_min(c->sub, c->pipe_cap));
        if (want == 0)
            return 0;
        ssize_t n = splice(c->sock, NULL, c->pipe[1], NULL, want, SPLICE_F_MOVE);
        if (n < 0 && zc_io_retry(c, "splice socket -> pipe", "splice socket -> pipe") < 0)
            return -1;
        if (n < 0)
            continue;
        if (n == 0)
            return 0;
        if (zc_splice_all(c, c->pipe[0], NULL, c->fd, NULL, (size_t)n, SPLICE_F_MOVE, "splice pipe -> sink") < 0)
            return -1;
        c->done += (uint64_t)n;
    }
}

const zc_mode_ops zc_recv_splice_ops = {
    .name = "splice",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_PIPE,
    .setup = setup,
    .transfer = transfer,
};
