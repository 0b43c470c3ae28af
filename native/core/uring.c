/* The raw io_uring ring of zc_uring.h: setup and its mmaps, SQE/CQE handling with the ring protocol's
 * acquire/release ordering, timed waits, and the probes of the modes' available(). Empty without ZC_HAVE_IO_URING.
 */
#include "zc_internal.h"
#include "zc_uring.h"

#ifdef ZC_HAVE_IO_URING

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef IORING_SETUP_SUBMIT_ALL
#define IORING_SETUP_SUBMIT_ALL (1U << 7)
#endif
#ifndef IORING_SETUP_COOP_TASKRUN
#define IORING_SETUP_COOP_TASKRUN (1U << 8)
#endif
#ifndef IORING_SETUP_SINGLE_ISSUER
#define IORING_SETUP_SINGLE_ISSUER (1U << 12)
#endif
#ifndef IORING_SETUP_DEFER_TASKRUN
#define IORING_SETUP_DEFER_TASKRUN (1U << 13)
#endif

static int sys_setup(unsigned entries, struct io_uring_params *p)
{
    int fd = (int)syscall(__NR_io_uring_setup, entries, p);
    return fd < 0 ? -errno : fd;
}

static int sys_enter(int fd, unsigned to_submit, unsigned min_complete, unsigned flags, void *arg, size_t argsz)
{
    int ret = (int)syscall(__NR_io_uring_enter, fd, to_submit, min_complete, flags, arg, argsz);
    return ret < 0 ? -errno : ret;
}

int zc_uring_register(zc_uring *r, unsigned opcode, void *arg, unsigned nr_args)
{
    int ret = (int)syscall(__NR_io_uring_register, r->fd, opcode, arg, nr_args);
    return ret < 0 ? -errno : ret;
}

static void *map_ring(int fd, size_t len, off_t off)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, off);
    return p == MAP_FAILED ? NULL : p;
}

int zc_uring_init(zc_uring *r, unsigned entries, unsigned cq_entries, int polled, const char **what)
{
    memset(r, 0, sizeof *r);
    r->fd = -1;
    /* newest flags first (an unknown one: EINVAL). A ring polled through its fd skips the first two: with
     * DEFER_TASKRUN/COOP_TASKRUN completions wait for the next enter, so its fd would not wake epoll_wait */
    static const unsigned tries[] = {
        IORING_SETUP_R_DISABLED | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN,
        IORING_SETUP_R_DISABLED | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN,
        IORING_SETUP_R_DISABLED | IORING_SETUP_SUBMIT_ALL,
        IORING_SETUP_R_DISABLED,
    };
    struct io_uring_params p;
    int fd = -EINVAL;
    for (size_t i = polled ? 2 : 0; i < sizeof tries / sizeof tries[0] && fd == -EINVAL; i++) {
        memset(&p, 0, sizeof p);
        p.flags = tries[i] | IORING_SETUP_CLAMP;
        if (cq_entries) {
            p.flags |= IORING_SETUP_CQSIZE;
            p.cq_entries = cq_entries;
        }
        fd = sys_setup(entries, &p);
    }
    if (fd < 0) {
        *what = "io_uring_setup";
        return fd;
    }
    r->fd = fd;
    r->flags = p.flags;
    r->features = p.features;
    r->sq_entries = p.sq_entries;
    r->cq_entries = p.cq_entries;
    r->sq_map_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    r->cq_map_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    int single = (p.features & IORING_FEAT_SINGLE_MMAP) != 0;
    if (single && r->cq_map_len > r->sq_map_len)
        r->sq_map_len = r->cq_map_len;
    r->sqes_len = p.sq_entries * sizeof(struct io_uring_sqe);
    r->sq_map = map_ring(fd, r->sq_map_len, IORING_OFF_SQ_RING);
    if (r->sq_map)
        r->cq_map = single ? r->sq_map : map_ring(fd, r->cq_map_len, IORING_OFF_CQ_RING);
    if (r->cq_map)
        r->sqes = map_ring(fd, r->sqes_len, IORING_OFF_SQES);
    if (!r->sqes) {
        int e = -errno;
        *what = !r->sq_map ? "mmap of the submission ring" : !r->cq_map ? "mmap of the completion ring"
                                                                        : "mmap of the submission entries";
        zc_uring_exit(r);
        return e;
    }
    char *sq = r->sq_map, *cq = r->cq_map;
    r->sq_head = (unsigned *)(sq + p.sq_off.head);
    r->sq_tail = (unsigned *)(sq + p.sq_off.tail);
    r->sq_mask = (unsigned *)(sq + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(sq + p.sq_off.array);
    r->cq_head = (unsigned *)(cq + p.cq_off.head);
    r->cq_tail = (unsigned *)(cq + p.cq_off.tail);
    r->cq_mask = (unsigned *)(cq + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(cq + p.cq_off.cqes);
    /* the SQ index array maps slot i to SQE i once and for all */
    for (unsigned i = 0; i < p.sq_entries; i++)
        r->sq_array[i] = i;
    r->sq_local_tail = *r->sq_tail;
    return 0;
}

#define WAIT_SLICE_NS (250 * 1000 * 1000LL)

int zc_uring_wait(zc_ctx *c, zc_uring *r, const char *doing)
{
    int rc = zc_uring_submit_wait(r, c->fiber ? 0 : 1, c->fiber ? 0 : WAIT_SLICE_NS);
    if (rc < 0 && rc != -ETIME) {
        errno = -rc;
        return zc_fail_errno(c, "io_uring_enter while %s", doing);
    }
    if (c->fiber && !zc_uring_peek(r))
        return zc_fiber_wait(c, r->fd, POLLIN, doing) < 0 ? -1 : 0;
    return zc_check_deadline(c, doing);
}

void zc_uring_exit(zc_uring *r)
{
    if (r->sqes)
        munmap(r->sqes, r->sqes_len);
    if (r->cq_map && r->cq_map != r->sq_map)
        munmap(r->cq_map, r->cq_map_len);
    if (r->sq_map)
        munmap(r->sq_map, r->sq_map_len);
    r->sqes = NULL;
    r->sq_map = r->cq_map = NULL;
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
}

int zc_uring_enable(zc_uring *r)
{
    if (!(r->flags & IORING_SETUP_R_DISABLED))
        return 0;
    int rc = zc_uring_register(r, IORING_REGISTER_ENABLE_RINGS, NULL, 0);
    return rc < 0 ? rc : 0;
}

struct io_uring_sqe *zc_uring_get_sqe(zc_uring *r)
{
    unsigned head = __atomic_load_n(r->sq_head, __ATOMIC_ACQUIRE);
    if (r->sq_local_tail - head >= r->sq_entries)
        return NULL;
    struct io_uring_sqe *sqe = &r->sqes[r->sq_local_tail & *r->sq_mask];
    memset(sqe, 0, sizeof *sqe);
    r->sq_local_tail++;
    r->to_submit++;
    return sqe;
}

int zc_uring_submit_wait(zc_uring *r, unsigned wait_nr, int64_t timeout_ns)
{
    /* publish the new SQEs: the kernel reads the tail with acquire semantics */
    __atomic_store_n(r->sq_tail, r->sq_local_tail, __ATOMIC_RELEASE);
    struct __kernel_timespec ts = {.tv_sec = timeout_ns / 1000000000LL, .tv_nsec = timeout_ns % 1000000000LL};
    struct io_uring_getevents_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.ts = (uint64_t)(uintptr_t)&ts;
    unsigned flags = IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG;
    int ret;
    do
        ret = sys_enter(r->fd, r->to_submit, wait_nr, flags, &arg, sizeof arg);
    while (ret == -EINTR);
    if (ret >= 0)
        r->to_submit -= (unsigned)ret <= r->to_submit ? (unsigned)ret : r->to_submit;
    return ret;
}

struct io_uring_cqe *zc_uring_peek(zc_uring *r)
{
    unsigned head = *r->cq_head;
    unsigned tail = __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE);
    if (head == tail)
        return NULL;
    return &r->cqes[head & *r->cq_mask];
}

void zc_uring_cqe_seen(zc_uring *r)
{
    __atomic_store_n(r->cq_head, *r->cq_head + 1, __ATOMIC_RELEASE);
}

int zc_uring_first_unsupported(zc_uring *r, const int *ops, int n)
{
    size_t len = sizeof(struct io_uring_probe) + 256 * sizeof(struct io_uring_probe_op);
    struct io_uring_probe *probe = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED)
        return -2;
    int rc = -1;
    if (zc_uring_register(r, IORING_REGISTER_PROBE, probe, 256) < 0) {
        rc = -2;
    } else {
        for (int i = 0; i < n && rc == -1; i++)
            if (ops[i] > probe->last_op || !(probe->ops[ops[i]].flags & IO_URING_OP_SUPPORTED))
                rc = ops[i];
    }
    munmap(probe, len);
    return rc;
}

int zc_uring_probe_ring(zc_uring *r, char *why, size_t len)
{
    const char *what = "";
    int rc = zc_uring_init(r, 4, 0, 0, &what);
    if (rc == 0 && (rc = zc_uring_enable(r)) < 0)
        what = "IORING_REGISTER_ENABLE_RINGS";
    if (rc == 0) {
        if (r->features & IORING_FEAT_EXT_ARG)
            return 1;
        zc_uring_exit(r);
        snprintf(why, len, "the kernel's io_uring has no timed waits (IORING_FEAT_EXT_ARG, Linux 5.11 or later)");
        return 0;
    }
    if (rc == -ENOSYS) {
        snprintf(why, len, "the kernel has no io_uring (io_uring_setup: ENOSYS; CONFIG_IO_URING off, or Linux "
                           "older than 5.1)");
    } else if (rc == -EPERM || rc == -EACCES) {
        char state[24] = "?";
        long disabled = zc_read_sysctl("/proc/sys/kernel/io_uring_disabled", -1);
        if (disabled >= 0)
            snprintf(state, sizeof state, "%ld", disabled);
        snprintf(why, len, "io_uring is not permitted here (%s: %s; sysctl kernel.io_uring_disabled=%s, or a "
                           "seccomp filter such as a container runtime's forbids io_uring)",
                 what, strerror(-rc), state);
    } else {
        snprintf(why, len, "io_uring cannot be used here (%s: %s)", what, strerror(-rc));
    }
    return 0;
}

int zc_uring_flags_accepted(zc_uring *r, void (*prep)(struct io_uring_sqe *sqe, int fd))
{
    struct io_uring_sqe *sqe = zc_uring_get_sqe(r);
    if (!sqe)
        return -EBUSY;
    prep(sqe, r->fd);
    sqe->user_data = 0x5a5a;
    int rc = zc_uring_submit_wait(r, 1, 1000000000LL);
    if (rc < 0 && rc != -ETIME)
        return rc;
    struct io_uring_cqe *cqe;
    int res = 0, seen = 0;
    while ((cqe = zc_uring_peek(r))) { /* a notification CQE may follow the request's own */
        if (!seen && cqe->user_data == 0x5a5a) {
            res = cqe->res;
            seen = 1;
        }
        zc_uring_cqe_seen(r);
    }
    if (!seen)
        return -ETIME;
    return res == -EINVAL ? 0 : 1;
}

#endif /* ZC_HAVE_IO_URING */
