/* recv mode "mmap": per chunk, extend the sink with ftruncate() (unless long enough already), mmap() the new
 * extent, read() from the socket into it (one sub-block a call at most), munmap(). At EOF the file is cut back
 * to the bytes received (never below its size before). A full filesystem shows as read() failing with EFAULT
 * (the page fault found no block): full_filesystem() tells it apart and reports ENOSPC/EDQUOT.
 */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* After read() into the mapping failed with EFAULT at offset `at`: ENOSPC or EDQUOT when that page got no block
 * (fallocate() of that page asks again; without fallocate(), the free blocks say), else 0 (a real EFAULT). */
static int full_filesystem(zc_ctx *c, uint64_t at)
{
    off_t page = (off_t)(at - at % c->page);
    if (fallocate(c->fd, FALLOC_FL_KEEP_SIZE, page, (off_t)c->page) < 0) {
        if (errno == ENOSPC || errno == EDQUOT)
            return errno;
        if (errno == EOPNOTSUPP) {
            struct statvfs vfs;
            if (fstatvfs(c->fd, &vfs) == 0 && (uint64_t)vfs.f_bfree * vfs.f_frsize < c->page)
                return ENOSPC;
        }
    }
    return 0;
}

static int setup(zc_ctx *c)
{
    if (!c->fd_is_reg)
        return zc_fail(c, EOPNOTSUPP, ZC_RULE_FILE_SINK, c->ops->name,
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
                int full = c->err->code == EFAULT ? full_filesystem(c, off + got) : 0;
                if (full)
                    zc_fail(c, full, "the filesystem of sink %s is %s: no block for the mapped page at offset "
                            "%llu (%llu bytes received; read() into the mmap()ed sink failed with EFAULT)",
                            c->p->sink, full == EDQUOT ? "over its quota" : "full",
                            (unsigned long long)(off + got - (off + got) % c->page),
                            (unsigned long long)c->done);
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

const zc_mode_ops zc_recv_mmap_ops = {
    .name = "mmap",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_FILE_SINK | ZC_CAP_ONE_STREAM, /* streams would extend and cut back one file concurrently */
    .setup = setup,
    .transfer = transfer,
};
