/* recv mode "mmap": per chunk, ftruncate() the sink to extend it (when it is not already long
 * enough: preallocated/overwrite sinks), mmap() the new extent (MAP_SHARED, from the page boundary
 * at or below it), read() from the socket into the mapping until the extent is full (one read per
 * sub-block at most), munmap(). At EOF the file is cut back to the bytes received (never below
 * its size before the transfer, so an overwritten file keeps its length).
 * Needs a regular-file sink: /dev/null and other non-regular files are refused.
 */
#include "zc_internal.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

static int setup(zc_ctx *c)
{
    if (!c->fd_is_reg)
        return zc_fail(c, EOPNOTSUPP, "needs a regular-file sink to mmap, %s is not one",
                       c->p->sink && *c->p->sink ? c->p->sink : "/dev/null");
    return 0;
}

static int transfer(zc_ctx *c)
{
    uint64_t size = c->orig_size;
    int eof = 0;
    while (!eof) {
        if (zc_check_deadline(c, "receiving") < 0)
            return -1;
        size_t ext = zc_recv_want(c, c->buffer);
        if (ext == 0)
            break;
        uint64_t off = c->done;
        if (off + ext > size) {
            if (ftruncate(c->fd, (off_t)(off + ext)) < 0)
                return zc_fail_errno(c, "ftruncate of sink %s to %llu bytes", c->p->sink,
                                     (unsigned long long)(off + ext));
            size = off + ext;
        }
        uint64_t aoff = off - off % c->page;
        size_t maplen = ext + (size_t)(off - aoff);
        unsigned char *map = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, (off_t)aoff);
        if (map == MAP_FAILED)
            return zc_fail_errno(c, "mmap of %zu bytes of sink %s at offset %llu", maplen, c->p->sink,
                                 (unsigned long long)aoff);
        unsigned char *dst = map + (off - aoff);
        size_t got = 0;
        int rc = 0;
        while (got < ext) {
            ssize_t n = zc_sock_read(c, dst + got, zc_min(c->sub, ext - got));
            if (n < 0) {
                rc = -1;
                break;
            }
            if (n == 0) {
                eof = 1;
                break;
            }
            got += (size_t)n;
            c->done += (uint64_t)n;
        }
        munmap(map, maplen);
        if (rc < 0)
            return -1;
    }
    uint64_t keep = c->done > c->orig_size ? c->done : c->orig_size;
    if (size > keep && ftruncate(c->fd, (off_t)keep) < 0)
        return zc_fail_errno(c, "ftruncate of sink %s back to %llu bytes", c->p->sink, (unsigned long long)keep);
    return 0;
}

static void teardown(zc_ctx *c) { (void)c; }

const zc_mode_ops zc_recv_mmap_ops = {
    .name = "mmap",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_FILE_SINK | ZC_CAP_ONE_STREAM, /* streams would extend and cut back one file concurrently */
    .setup = setup,
    .transfer = transfer,
    .teardown = teardown,
};
