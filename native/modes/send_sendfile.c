/* send mode "sendfile": sendfile() from the source file to the socket, one call per sub-block (looping on
 * short returns). For a non-regular file (/dev/zero) the kernel decides: a refusal is reported.
 */
#include "zc_internal.h"

#include <errno.h>
#include <sys/sendfile.h>

static int transfer(zc_ctx *c)
{
    off_t off = (off_t)c->base; /* this stream's slice (0 with one stream) */
    off_t *offp = c->fd_is_reg ? &off : NULL;
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        for (size_t o = 0; o < len;) {
            size_t l = zc_min(c->sub, len - o);
            ssize_t n = sendfile(c->sock, c->fd, offp, l);
            if (n > 0) {
                o += (size_t)n;
                c->done += (uint64_t)n;
            } else if (n == 0) {
                return zc_fail(c, EIO, "source %s ended after %llu bytes, before the %llu requested", c->p->source,
                               (unsigned long long)c->done, (unsigned long long)c->total);
            } else {
                int again = zc_io_retry(c, "sendfile to the socket", NULL);
                if (again < 0)
                    return -1;
                if (again)
                    continue;
                if (errno == EINVAL && c->done == 0)
                    return zc_fail_errno(c, "the kernel refused sendfile from %s", c->p->source);
                return zc_fail_errno(c, "sendfile from %s", c->p->source);
            }
        }
    }
    return more; /* 0: done, -1: failed */
}

const zc_mode_ops zc_send_sendfile_ops = {
    .name = "sendfile",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_FILE_SOURCE,
    .transfer = transfer,
};
