/* Several streams on one thread (--threads below --streams): each stream of the thread runs as a fiber
 * (a ucontext with a stack of its own) over a nonblocking socket, and the thread's scheduler multiplexes
 * them with one epoll instance. The modes keep their loops as they are: wherever a stream would block
 * (a socket call that returns EAGAIN: zc_io_retry; a wait for MSG_ZEROCOPY completions, for a
 * zerocopy_recv window, for io_uring completions: zc_wait_fd, zc_uring_wait), its fiber parks on that
 * file descriptor and the scheduler runs another stream. So every stream keeps its own partial write,
 * its own EAGAIN and its own completions, in the very code that handles them with one stream per thread.
 *
 * Why fibers rather than a rewrite of every mode as a state machine: the per-stream state is all in the
 * mode's loop (a chunk half written, a pipe half drained, a buffer waiting for its zero-copy
 * notifications); parking the loop keeps it whole, and one code path serves every thread count.
 *
 * epoll is edge-triggered (EPOLLET), each fd registered once per run: a wait without a fresh EAGAIN
 * first polls the fd (zc_wait_fd), so an edge that came before the wait is never lost. io_uring rings
 * of a shared thread are waited for through their fd (readable when completions are there; the ring is
 * made without DEFER_TASKRUN/COOP_TASKRUN for that, see uring.c), one ring per stream as with a thread
 * per stream: its depth, registered buffers and CQE counts stay the stream's own.
 *
 * Turns: a stream that never hits EAGAIN (a fast reader) would starve the others, so a stream gives way
 * after one buffer (--buffer bytes, one chunk of its mode's loop; zc_check_deadline, the top of every
 * chunk loop, calls zc_fiber_share): round robin chunk by chunk, as iperf3 writes one block per stream
 * per select round (longer turns, 1 MiB, let one socket's queue fill in a burst while the others idle).
 *
 * Waiting: when every stream of the thread is parked, a thread pinned to a CPU (--cpu/--cpus)
 * first polls its epoll for up to ZC_MUX_SPIN_NS, then sleeps. On loopback with the sides on two CPUs a thread that sleeps each time
 * it has caught up with its peer is woken again tens of microseconds later, and the wake-up is paid by
 * the peer (sock_def_readable in the softirq of the sender's own send, a reschedule IPI; on a VM an exit
 * on both sides): with 8 streams per side pinned the receiving thread slept ~4,000-8,000 times per GiB
 * and the sender paid ~25 us for each, CPU per GiB 0.30-0.40 s instead of ~0.2 (iperf3 -P 8, whose
 * select() loop sleeps ~1,700 times per GiB, 0.2-0.25). The poll is adaptive, so a slow peer costs
 * nothing: a poll that sees no event stops polling, and polling resumes only after a sleep that ended
 * within 2 x ZC_MUX_SPIN_NS (one a poll would have covered, wake-up latency included). Its CPU time is
 * the thread's, credited like the rest (see CPU accounting): nothing of it leaves the measured process.
 * An unpinned thread sleeps at once: it may share its CPU with the very peer it waits for (and on a
 * loaded machine its polls cost the sender ~15% CPU per GiB, unpinned, for no throughput).
 *
 * CPU accounting: RUSAGE_THREAD is the thread's, so at each switch the time since the previous switch is
 * credited to the stream that ran (the scheduler's own epoll_wait to the stream it ran for); each
 * stream's utime/stime/faults/switches are then its own share and the streams' sum is the thread's.
 */
#include "zc_core.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <ucontext.h>
#include <unistd.h>

#define ZC_FIBER_STACK (256u << 10)     /* the deepest path is an error message's vsnprintf */
#define ZC_MUX_SPIN_NS 50000LL         /* the longest poll before a thread of streams sleeps */
#define ZC_MUX_SLICE_MS 250             /* the longest epoll_wait: deadlines are looked at in between */
#define ZC_FIBER_FDS 4                  /* fds one stream waits on: its socket, its ring */

enum { F_READY, F_RUNNING, F_WAITING, F_DONE };

typedef struct zc_fiber {
    ucontext_t uc;
    unsigned char *stack;            /* the stack with a guard page below */
    size_t stack_len;
    struct zc_mux *mux;
    zc_ctx *c;
    int index;                       /* in its group */
    int slot;                        /* in its mux */
    int state;
    int wait_fd;
    uint32_t wait_events;            /* POLLIN/POLLOUT (the same bits as EPOLLIN/EPOLLOUT) */
    uint32_t revents;                /* what ended the wait (0: the deadline passed) */
    int wait_errno;                  /* epoll_wait failed: the waiting stream fails with it */
    uint64_t turn_done;              /* c->done when it last got the thread */
    int counting;                    /* the thread's CPU time accrues to its timed region */
    int64_t utime_us, stime_us, minflt, majflt, nvcsw, nivcsw;
    int fds[ZC_FIBER_FDS];
    int nfds;
} zc_fiber;

typedef struct zc_mux {
    int epfd;
    ucontext_t main;
    zc_fiber *fibers;
    int n;
    zc_fiber *cur;                   /* the fiber running now (NULL: the scheduler) */
    zc_fiber *accrue;                /* who the CPU time since `last` belongs to */
    int64_t spin_ns;                 /* how long the next wait polls before it sleeps (0: it sleeps) */
    int64_t spin_max;                /* ZC_MUX_SPIN_NS for a thread pinned to a CPU, else 0: never polls */
    struct rusage last;
} zc_mux;

static __thread zc_mux *tls_mux;

static int64_t tv_us(struct timeval tv) { return (int64_t)tv.tv_sec * 1000000 + tv.tv_usec; }

/* Credit the thread's CPU time since the last switch to the fiber it belongs to. */
static void accrue(zc_mux *m)
{
    struct rusage now;
    getrusage(RUSAGE_THREAD, &now);
    zc_fiber *f = m->accrue;
    if (f && f->counting) {
        f->utime_us += tv_us(now.ru_utime) - tv_us(m->last.ru_utime);
        f->stime_us += tv_us(now.ru_stime) - tv_us(m->last.ru_stime);
        f->minflt += now.ru_minflt - m->last.ru_minflt;
        f->majflt += now.ru_majflt - m->last.ru_majflt;
        f->nvcsw += now.ru_nvcsw - m->last.ru_nvcsw;
        f->nivcsw += now.ru_nivcsw - m->last.ru_nivcsw;
    }
    m->last = now;
}

void zc_fiber_account_begin(zc_ctx *c)
{
    zc_fiber *f = c->fiber;
    accrue(f->mux);
    f->utime_us = f->stime_us = f->minflt = f->majflt = f->nvcsw = f->nivcsw = 0;
    f->counting = 1;
}

void zc_fiber_account_end(zc_ctx *c)
{
    zc_fiber *f = c->fiber;
    accrue(f->mux);
    f->counting = 0;
    c->m.utime_us = f->utime_us;
    c->m.stime_us = f->stime_us;
    c->m.minflt = f->minflt;
    c->m.majflt = f->majflt;
    c->m.nvcsw = f->nvcsw;
    c->m.nivcsw = f->nivcsw;
}

/* From the fiber back to its thread's scheduler; returns when the scheduler runs it again. */
static void park(zc_fiber *f, int state)
{
    f->state = state;
    swapcontext(&f->uc, &f->mux->main);
}

static int watch_fd(zc_ctx *c, zc_fiber *f, int fd)
{
    for (int i = 0; i < f->nfds; i++)
        if (f->fds[i] == fd)
            return 0;
    if (f->nfds == ZC_FIBER_FDS)
        return zc_fail(c, EINVAL, "a stream waits on more than %d descriptors (bug)", ZC_FIBER_FDS);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET,
                             .data.u64 = (uint64_t)(uint32_t)f->slot << 32 | (uint32_t)fd};
    if (epoll_ctl(f->mux->epfd, EPOLL_CTL_ADD, fd, &ev) < 0 && errno != EEXIST)
        return zc_fail_errno(c, "epoll_ctl(EPOLL_CTL_ADD)");
    f->fds[f->nfds++] = fd;
    return 0;
}

int zc_fiber_wait(zc_ctx *c, int fd, short events, const char *doing)
{
    zc_fiber *f = c->fiber;
    if (watch_fd(c, f, fd) < 0)
        return -1;
    f->wait_fd = fd;
    f->wait_events = (uint32_t)(unsigned short)events;
    f->revents = 0;
    f->wait_errno = 0;
    park(f, F_WAITING);
    if (f->wait_errno) {
        errno = f->wait_errno;
        return zc_fail_errno(c, "epoll_wait while %s", doing);
    }
    if (!f->revents)
        return zc_check_deadline(c, doing);
    return (int)(f->revents & (POLLIN | POLLOUT | POLLERR | POLLHUP));
}

void zc_fiber_share(zc_ctx *c)
{
    zc_fiber *f = c->fiber;
    if (f->mux->n > 1 && c->done - f->turn_done >= c->buffer)
        park(f, F_READY);
}

int zc_wait_fd(zc_ctx *c, int fd, short events, const char *doing)
{
    struct pollfd pfd = {.fd = fd, .events = events};
    int n = poll(&pfd, 1, c->fiber ? 0 : ZC_MUX_SLICE_MS);
    if (n < 0 && errno != EINTR)
        return zc_fail_errno(c, "poll while %s", doing);
    if (n > 0)
        return pfd.revents;
    if (c->fiber)
        return zc_fiber_wait(c, fd, events, doing);
    return zc_check_deadline(c, doing);
}

static void fiber_main(void)
{
    zc_mux *m = tls_mux;
    zc_fiber *f = m->cur;
    zc_group *g = f->c->group;
    int rc = zc_stream_transfer(f->c);
    g->rc[f->index] = rc;
    g->tfail[f->index] = rc ? zc_now_ns() : 0;
    f->state = F_DONE; /* uc_link: back to the scheduler */
}

static void run(zc_mux *m, zc_fiber *f)
{
    accrue(m);
    m->accrue = f;
    m->cur = f;
    f->turn_done = f->c->done;
    f->state = F_RUNNING;
    swapcontext(&m->main, &f->uc);
    m->cur = NULL;
}

/* Every stream parked: epoll_wait up to timeout_ms, polling first while polling pays (see the top). */
static int wait_events(zc_mux *m, struct epoll_event *evs, int max, int timeout_ms)
{
    int64_t t0 = zc_now_ns();
    if (m->spin_ns > 0) {
        int64_t until = t0 + m->spin_ns;
        do {
            int nev = epoll_wait(m->epfd, evs, max, 0);
            if (nev != 0)
                return nev;
        } while (zc_now_ns() < until);
        m->spin_ns = 0;
        t0 = zc_now_ns();
    }
    int nev = epoll_wait(m->epfd, evs, max, timeout_ms);
    if (nev > 0 && zc_now_ns() - t0 < 2 * ZC_MUX_SPIN_NS)
        m->spin_ns = m->spin_max;
    return nev;
}

/* The scheduler: run every ready stream in turn, then collect what the waiting ones wait for. */
static void schedule(zc_mux *m)
{
    struct epoll_event evs[64];
    int live = m->n;
    while (live > 0) {
        int ready = 0, waiting = 0;
        int64_t first_deadline = INT64_MAX;
        for (int i = 0; i < m->n; i++) {
            zc_fiber *f = &m->fibers[i];
            if (f->state == F_READY) {
                run(m, f);
                if (f->state == F_DONE)
                    live--;
            }
            if (f->state == F_READY)
                ready++;
            if (f->state == F_WAITING) {
                waiting++;
                if (f->c->deadline_ns < first_deadline)
                    first_deadline = f->c->deadline_ns;
            }
        }
        if (!waiting)
            continue;
        int timeout = 0;
        if (!ready) {
            int64_t left = first_deadline - zc_now_ns();
            timeout = left <= 0 ? 0 : left >= ZC_MUX_SLICE_MS * 1000000LL ? ZC_MUX_SLICE_MS
                                                                            : (int)((left + 999999) / 1000000);
        }
        int max = (int)(sizeof evs / sizeof evs[0]);
        int nev = ready ? epoll_wait(m->epfd, evs, max, 0) : wait_events(m, evs, max, timeout);
        if (nev < 0 && errno != EINTR) {
            int e = errno;
            for (int i = 0; i < m->n; i++)
                if (m->fibers[i].state == F_WAITING) {
                    m->fibers[i].wait_errno = e;
                    m->fibers[i].state = F_READY;
                }
            continue;
        }
        for (int k = 0; k < nev; k++) {
            zc_fiber *f = &m->fibers[evs[k].data.u64 >> 32];
            int fd = (int)(uint32_t)evs[k].data.u64;
            if (f->state == F_WAITING && f->wait_fd == fd &&
                (evs[k].events & (f->wait_events | EPOLLERR | EPOLLHUP))) {
                f->revents = evs[k].events;
                f->state = F_READY;
            }
        }
        int64_t now = zc_now_ns();
        for (int i = 0; i < m->n; i++) /* a wait past its deadline ends with nothing: the stream fails */
            if (m->fibers[i].state == F_WAITING && now >= m->fibers[i].c->deadline_ns)
                m->fibers[i].state = F_READY;
    }
}

static void free_fibers(zc_mux *m)
{
    for (int i = 0; i < m->n; i++) {
        zc_fiber *f = &m->fibers[i];
        if (f->stack)
            munmap(f->stack, f->stack_len);
        if (f->c) /* NULL past a stream whose preparation failed */
            f->c->fiber = NULL;
    }
    free(m->fibers);
    if (m->epfd >= 0)
        close(m->epfd);
}

/* Ready streams idx[0..n) of g to share the calling thread (untimed): their fibers, their sockets
 * nonblocking, the epoll instance. 0, or -1 with the first failing stream's error (the others get
 * it too). */
static int prepare(zc_mux *m, zc_group *g, const int *idx, int n)
{
    memset(m, 0, sizeof *m);
    m->epfd = -1;
    m->n = n;
    m->fibers = calloc((size_t)n, sizeof *m->fibers);
    zc_ctx *c0 = &g->ctx[idx[0]];
    m->spin_max = m->spin_ns = c0->p->ncpus > 0 || c0->p->cpu >= 0 ? ZC_MUX_SPIN_NS : 0; /* as zc_pin_cpu */
    if (!m->fibers)
        return zc_fail(c0, ENOMEM, "out of memory for the thread's streams");
    m->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (m->epfd < 0)
        return zc_fail_errno(c0, "epoll_create1");
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    for (int i = 0; i < n; i++) {
        zc_fiber *f = &m->fibers[i];
        zc_ctx *c = &g->ctx[idx[i]];
        f->mux = m;
        f->c = c;
        f->index = idx[i];
        f->slot = i;
        f->state = F_READY;
        c->fiber = f;
        int fl = fcntl(c->sock, F_GETFL);
        if (fl < 0 || fcntl(c->sock, F_SETFL, fl | O_NONBLOCK) < 0)
            return zc_fail_errno(c, "fcntl(O_NONBLOCK) of the socket");
        f->stack_len = ZC_FIBER_STACK + page;
        f->stack = mmap(NULL, f->stack_len, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
        if (f->stack == MAP_FAILED) {
            f->stack = NULL;
            return zc_fail_errno(c, "mmap of a %u KiB stream stack", ZC_FIBER_STACK >> 10);
        }
        mprotect(f->stack, page, PROT_NONE); /* a guard page: an overflow faults instead of corrupting */
        if (getcontext(&f->uc) < 0)
            return zc_fail_errno(c, "getcontext");
        f->uc.uc_stack.ss_sp = f->stack;
        f->uc.uc_stack.ss_size = f->stack_len;
        f->uc.uc_link = &m->main;
        makecontext(&f->uc, fiber_main, 0);
    }
    return 0;
}

int zc_mux_prepare(zc_mux **out, zc_group *g, const int *idx, int n)
{
    zc_mux *m = calloc(1, sizeof *m);
    *out = m;
    if (!m)
        return zc_fail(&g->ctx[idx[0]], ENOMEM, "out of memory for the thread's streams");
    return prepare(m, g, idx, n);
}

void zc_mux_run(zc_mux *m)
{
    tls_mux = m;
    schedule(m);
    accrue(m);
    tls_mux = NULL;
}

void zc_mux_free(zc_mux *m)
{
    if (m) {
        if (m->fibers)
            free_fibers(m);
        else if (m->epfd >= 0)
            close(m->epfd);
        free(m);
    }
}
