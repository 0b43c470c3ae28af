/* send mode "splice": splice() source file -> pipe -> socket, one pair per sub-block (or pipe-full). */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>

static int setup(zc_ctx *c)
{
    return zc_open_pipe(c, c->sub); /* source mem is refused by the cell rules (validate.c: ZC_CAP_FILE_SOURCE) */
}

static int transfer(zc_ctx *c)
{
    loff_t off = (loff_t)c->base; /* this stream's slice (0 with one stream) */
    loff_t *offp = c->fd_is_reg ? &off : NULL;
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        for (size_t o = 0; o < len;) {
            size_t want = zc_min(zc_min(c->sub, len - o), c->pipe_cap);
            ssize_t n = splice(c->fd, offp, c->pipe[1], NULL, want, SPLICE_F_MOVE);
            if (n < 0) {
                if (errno == EINTR)
                    continue;
                if (errno == EINVAL && c->done == 0)
                    return zc_fail_errno(c, "the kernel refused splice from %s into a pipe", c->p->source);
                return zc_fail_errno(c, "splice %s -> pipe", c->p->source);
            }
            if (n == 0)
                return zc_fail(c, EIO, "source %s ended after %llu bytes, before the %llu requested", c->p->source,
                               (unsigned long long)c->done, (unsigned long long)c->total);
            if (zc_splice_all(c, c->pipe[0], NULL, c->sock, NULL, (size_t)n, SPLICE_F_MOVE, "splice pipe -> socket") < 0)
                return -1;
            o += (size_t)n;
            c->done += (uint64_t)n;
        }
    }
    return more; /* 0: done, -1: failed */
}

const zc_mode_ops zc_send_splice_ops = {
    .name = "splice",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_FILE_SOURCE | ZC_CAP_PIPE,
    .setup = setup,
    .transfer = transfer,
};
