/* The files of one stream, untimed: the sender's source (mem, a file, a device) and the receiver's sink,
 * prepared as --sink-state says. Each is opened by openpath.c, and what depends on its kind is decided on
 * the descriptor, never on the name.
 */
#include "zc_core.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

int zc_open_source(zc_ctx *c)
{
    const zc_params *p = c->p;
    if (zc_duration_set(p) && zc_bytes_set(p))
        return zc_fail(c, EINVAL, ZC_RULE_BYTES_AND_DURATION);
    if (!p->source || !*p->source || strcmp(p->source, "mem") == 0) {
        c->src_mem = 1;
        c->total_known = 1;
        if (zc_duration_set(p)) {
            c->total = ZC_UNTIL_TIME_BYTES;
            return 0;
        }
        if (!zc_bytes_set(p))
            return zc_fail(c, EINVAL, "--bytes is required with source mem");
        c->total = p->bytes;
        return 0;
    }
    struct stat st;
    zc_error oe;
    c->fd = zc_open_path(p->source, ZC_OPEN_SOURCE, &st, NULL, &oe); /* no link followed, judged on the fd */
    if (c->fd < 0)
        return zc_fail(c, oe.code, "%s", oe.message);
    c->total_known = 1;
    c->src_zero = S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 5);
    if (zc_duration_set(p)) { /* no silent wrap-around: a file runs out before the time is up */
        if (!c->src_zero)
            return zc_fail(c, EINVAL, ZC_RULE_DURATION_SOURCE, p->source);
        c->total = ZC_UNTIL_TIME_BYTES;
        return 0;
    }
    if (S_ISREG(st.st_mode)) {
        c->fd_is_reg = 1;
        if (zc_bytes_set(p) && (uint64_t)st.st_size < p->bytes)
            return zc_fail(c, EINVAL, "source %s is %llu bytes, shorter than --bytes %llu", p->source,
                           (unsigned long long)st.st_size, (unsigned long long)p->bytes);
        c->total = zc_bytes_set(p) ? p->bytes : (uint64_t)st.st_size;
        return 0;
    }
    if (!zc_bytes_set(p))
        return zc_fail(c, EINVAL, "--bytes is required with source %s (it has no size)", p->source);
    c->total = p->bytes;
    return 0;
}

static int write_zeros(zc_ctx *c, uint64_t from, uint64_t to)
{
    size_t len = 1 << 20;
    unsigned char *z = zc_alloc(c, len, "zero-filling the sink");
    if (!z)
        return -1;
    int rc = 0;
    while (from < to) {
        size_t n = zc_min(len, to - from);
        ssize_t w = pwrite(c->fd, z, n, (off_t)from);
        if (w <= 0) {
            if (w < 0 && errno == EINTR)
                continue;
            rc = zc_fail_errno(c, "writing the sink %s once before overwriting it", c->p->sink);
            break;
        }
        from += (uint64_t)w;
    }
    zc_free(z, len);
    if (rc == 0 && fsync(c->fd) < 0)
        rc = zc_fail_errno(c, "fsync of the sink %s after writing it once", c->p->sink);
    return rc;
}

static const char *sink_state_name(int s)
{
    return s == ZC_SINK_STATE_FRESH ? "fresh" : s == ZC_SINK_STATE_PREALLOCATED ? "preallocated" : "overwrite";
}

int zc_open_sink(zc_ctx *c)
{
    const zc_params *p = c->p;
    const char *path = p->sink && *p->sink ? p->sink : "/dev/null";
    if (zc_duration_set(p) && zc_bytes_set(p))
        return zc_fail(c, EINVAL, ZC_RULE_BYTES_AND_DURATION);
    if (p->sink_state != ZC_SINK_STATE_FRESH && !zc_bytes_set(p))
        return zc_fail(c, EINVAL, ZC_RULE_SINK_STATE_BYTES, sink_state_name(p->sink_state));
    /* the slices' lengths are unknown until the time is up: no file sink for several streams (none created) */
    int file_refused = zc_duration_set(p) && p->streams > 1;
    struct stat st;
    zc_error oe;
    int created = 0;
    int how = ZC_OPEN_SINK | (file_refused ? 0 : ZC_OPEN_CREATE) | (p->allow_device_sink ? ZC_OPEN_DEVICES : 0);
    c->fd = zc_open_path(path, how, &st, &created, &oe); /* no link followed, judged on the fd */
    if (c->fd < 0 && file_refused && oe.code == ENOENT)
        return zc_fail(c, EINVAL, ZC_RULE_DURATION_STREAMS, p->streams);
    if (c->fd < 0)
        return zc_fail(c, oe.code, "%s", oe.message);
    int reg = S_ISREG(st.st_mode);
    if (!reg && p->sink_state != ZC_SINK_STATE_FRESH)
        return zc_fail(c, EINVAL, ZC_RULE_SINK_STATE_SINK, sink_state_name(p->sink_state), path);
    if (!reg && p->fsync)
        return zc_fail(c, EINVAL, ZC_RULE_FSYNC_SINK, path);
    if (reg && file_refused)
        return zc_fail(c, EINVAL, ZC_RULE_DURATION_STREAMS, p->streams);
    if (reg && !created && p->sink_state != ZC_SINK_STATE_OVERWRITE && ftruncate(c->fd, 0) < 0)
        return zc_fail_errno(c, "truncating the sink %s", path);
    if (reg && !created && p->sink_state != ZC_SINK_STATE_OVERWRITE)
        st.st_size = 0;
    c->fd_is_reg = reg;
    if (p->sink_state == ZC_SINK_STATE_PREALLOCATED && p->bytes > 0 &&
        fallocate(c->fd, 0, 0, (off_t)p->bytes) < 0)
        return zc_fail_errno(c, "fallocate of %llu bytes for sink %s", (unsigned long long)p->bytes, path);
    if (p->sink_state == ZC_SINK_STATE_OVERWRITE && (uint64_t)st.st_size < p->bytes &&
        write_zeros(c, (uint64_t)st.st_size, p->bytes) < 0)
        return -1;
    if (fstat(c->fd, &st) < 0)
        return zc_fail_errno(c, "fstat of sink %s", path);
    c->orig_size = (uint64_t)st.st_size;
    c->total_known = zc_bytes_set(p);
    c->total = p->bytes;
    return 0;
}

/* Another stream of the group: the sink `first` prepared, opened again (its own file offset) */
int zc_reopen_sink(zc_ctx *c, const zc_ctx *first)
{
    const char *path = c->p->sink && *c->p->sink ? c->p->sink : "/dev/null";
    struct stat st;
    zc_error oe;
    c->fd = zc_open_path(path, ZC_OPEN_SINK | (c->p->allow_device_sink ? ZC_OPEN_DEVICES : 0), &st, NULL, &oe);
    if (c->fd < 0)
        return zc_fail(c, oe.code, "%s again for stream %d", oe.message, c->stream);
    struct stat st0;  /* the file stream 0 prepared, not one put in its place since */
    if (fstat(first->fd, &st0) < 0 || st0.st_dev != st.st_dev || st0.st_ino != st.st_ino)
        return zc_fail(c, EAGAIN, "sink %s was replaced after stream 0 opened it: refused", path);
    c->fd_is_reg = first->fd_is_reg;
    c->orig_size = first->orig_size;
    c->total_known = first->total_known;
    c->total = first->total;
    return 0;
}
