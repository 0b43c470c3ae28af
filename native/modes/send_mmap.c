/* send mode "mmap": per sub-block, mmap() the source from the page boundary at or below it, write() it to the
 * socket, munmap(). Needs a regular file (mapping /dev/zero would silently send anonymous memory).
 */
#include "zc_internal.h"

#include <errno.h>
#include <sys/mman.h>

static int setup(zc_ctx *c)
{
    if (!c->fd_is_reg) /* source mem is refused by the cell rules (validate.c: ZC_CAP_MAPPABLE_SOURCE) */
        return zc_fail(c, EOPNOTSUPP, ZC_RULE_MAPPABLE_SOURCE, c->ops->name, c->p->source);
    return 0;
}

static int transfer(zc_ctx *c)
{
    int more;
    while ((more = zc_send_more(c)) > 0) {
        size_t len = zc_min(c->buffer, c->total - c->done);
        uint64_t base = c->done;
        for (size_t o = 0; o < len; o += c->sub) {
            size_t l = zc_min(c->sub, len - o);
            uint64_t off = c->base + base + o; /* c->base: this stream's slice */
            uint64_t aoff = off - off % c->page;
            size_t maplen = l + (size_t)(off - aoff);
            unsigned char *map = mmap(NULL, maplen, PROT_READ, MAP_SHARED, c->fd, (off_t)aoff);
            if (map == MAP_FAILED)
                return zc_fail_errno(c, "mmap of %zu bytes of %s at offset %llu", maplen, c->p->source,
                                     (unsigned long long)aoff);
            int rc = zc_sock_write_all(c, map + (off - aoff), l);
            munmap(map, maplen);
            if (rc < 0)
                return -1;
        }
    }
    return more; /* 0: done, -1: failed */
}

const zc_mode_ops zc_send_mmap_ops = {
    .name = "mmap",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_FILE_SOURCE | ZC_CAP_MAPPABLE_SOURCE,
    .setup = setup,
    .transfer = transfer,
};
