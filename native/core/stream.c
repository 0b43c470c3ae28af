/* One stream: its context, its CPU, its timed region (the mode's loop and nothing else) and the checks
 * after it (untimed): the sender half-closes and waits for the receiver's close, so a result means every
 * byte arrived; the receiver checks it got --bytes and no more. The receiver's fsync is the group's.
 */
#include "zc_core.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define ZC_SLICE_ALIGN 4096u

void zc_ctx_init(zc_ctx *c, const zc_params *p, zc_error *err)
{
    memset(c, 0, sizeof *c);
    c->p = p;
    c->err = err;
    c->sock = c->listen_fd = c->fd = -1;
    c->pipe[0] = c->pipe[1] = -1;
    c->page = (size_t)sysconf(_SC_PAGESIZE);
    c->nstreams = 1;
    err->code = 0;
    err->message[0] = '\0';
    /* with --duration the timeout is the slack after it (connecting, draining, the final handshakes) */
    double t = (p->timeout > 0 ? p->timeout : 0) + (p->duration > 0 ? p->duration : 0);
    c->deadline_ns = zc_now_ns() + (int64_t)(t * 1e9);
}

void zc_ctx_cleanup(zc_ctx *c)
{
    if (c->ops && c->ops->teardown)
        c->ops->teardown(c);
    if (c->sock >= 0)
        close(c->sock);
    if (c->listen_fd >= 0)
        close(c->listen_fd);
    if (c->fd >= 0)
        close(c->fd);
    for (int i = 0; i < 2; i++)
        if (c->pipe[i] >= 0)
            close(c->pipe[i]);
    if (!c->mem_ring_borrowed)
        zc_free(c->mem_ring, c->mem_ring_len);
    c->sock = c->listen_fd = c->fd = c->pipe[0] = c->pipe[1] = -1;
    c->mem_ring = NULL;
    c->ops = NULL;
}

/* Pin the calling thread, thread `thread` of the group: --cpus' t-th CPU (round robin), else --cpu */
int zc_pin_cpu(zc_ctx *c, int thread)
{
    int cpu = c->p->ncpus > 0 ? c->p->cpus[thread % c->p->ncpus] : c->p->cpu;
    if (cpu < 0)
        return 0;
    cpu_set_t *set = CPU_ALLOC((size_t)cpu + 1);
    if (!set)
        return zc_fail_errno(c, "CPU_ALLOC(%d)", cpu + 1);
    size_t size = CPU_ALLOC_SIZE((size_t)cpu + 1);
    CPU_ZERO_S(size, set);
    CPU_SET_S((size_t)cpu, size, set);
    int rc = sched_setaffinity(0, size, set);
    CPU_FREE(set);
    if (rc < 0)
        return zc_fail_errno(c, "sched_setaffinity(cpu %d)", cpu);
    return 0;
}

/* Stream i's slice of `total` bytes over n streams: multiples of ZC_SLICE_ALIGN, the last takes the rest. */
void zc_stream_slice(uint64_t total, int n, int i, uint64_t *off, uint64_t *len)
{
    uint64_t per = (total / (uint64_t)n) / ZC_SLICE_ALIGN * ZC_SLICE_ALIGN;
    *off = per * (uint64_t)i;
    *len = i == n - 1 ? total - *off : per;
}

static int64_t tv_us(struct timeval tv) { return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec; }

void zc_rusage_add(zc_metrics *m, const struct rusage *a, const struct rusage *b)
{
    m->utime_us += tv_us(b->ru_utime) - tv_us(a->ru_utime);
    m->stime_us += tv_us(b->ru_stime) - tv_us(a->ru_stime);
    m->minflt += b->ru_minflt - a->ru_minflt;
    m->majflt += b->ru_majflt - a->ru_majflt;
    m->nvcsw += b->ru_nvcsw - a->ru_nvcsw;
    m->nivcsw += b->ru_nivcsw - a->ru_nivcsw;
}

/* A receiver's clock starts at its first byte, not at accept: the sender's start is no part of the rate.
 * Bounded by the deadline (the transfer then reports it); a fiber starts at once (not to stall its siblings). */
static void wait_first_byte(zc_ctx *c)
{
    if (c->p->side != ZC_SIDE_RECV || c->fiber || c->sock < 0)
        return;
    struct pollfd pfd = {.fd = c->sock, .events = POLLIN};
    int64_t left; /* zc_ctx_init always sets a deadline */
    while ((left = c->deadline_ns - zc_now_ns()) > 0) {
        int rc = poll(&pfd, 1, (int)(left / 1000000 + 1));
        if (rc != 0 && !(rc < 0 && errno == EINTR))
            return;                      /* readable, hung up, or an error the transfer will report */
    }
}

/* The measured region: the mode's loop, nothing else (a fiber's CPU time: mux.c credits it at every switch) */
static int timed_transfer(zc_ctx *c)
{
    struct rusage r0, r1, self;
    wait_first_byte(c);
    if (c->fiber)
        zc_fiber_counting(c, 1);
    else
        getrusage(RUSAGE_THREAD, &r0);
    c->t0_ns = zc_now_ns();
    if (c->p->side == ZC_SIDE_SEND && zc_duration_set(c->p))
        c->end_ns = c->t0_ns + (int64_t)(c->p->duration * 1e9);
    int rc = c->ops->transfer(c);
    c->t1_ns = zc_now_ns();
    if (c->fiber) {
        zc_fiber_counting(c, 0);
    } else {
        getrusage(RUSAGE_THREAD, &r1);
        zc_rusage_add(&c->m, &r0, &r1); /* c->m starts zeroed (zc_ctx_init) */
    }
    getrusage(RUSAGE_SELF, &self);
    c->m.bytes = c->done;
    c->m.wall_ns = c->t1_ns - c->t0_ns;
    c->m.maxrss_kib = self.ru_maxrss;
    return rc;
}

int zc_stream_transfer(zc_ctx *c)
{
    int rc = timed_transfer(c);
    if (c->p->side == ZC_SIDE_SEND) {
        if (rc == 0 && c->done != c->total)
            rc = zc_fail(c, EIO, "moved %llu bytes instead of %llu (bug)", (unsigned long long)c->done,
                         (unsigned long long)c->total);
        if (rc == 0) {
            zc_read_tcp_info(c);
            rc = zc_await_receiver_close(c);
        }
    } else {
        if (rc == 0 && c->total_known && c->done < c->total)
            rc = zc_fail(c, ENODATA, "short transfer: the sender closed the connection after %llu of %llu bytes",
                         (unsigned long long)c->done, (unsigned long long)c->total);
        if (rc == 0) {
            zc_read_tcp_info(c);
            if (c->total_known)
                rc = zc_expect_eof(c);
        }
    }
    return rc;
}
