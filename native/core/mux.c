/* Several streams on one thread (--threads below --streams), as fibers (a ucontext with its own stack) over
 * nonblocking sockets, multiplexed by one edge-triggered epoll. Wherever a stream would block (EAGAIN in
 * zc_io_retry, zc_wait_fd, zc_uring_wait) its fiber parks on that fd and another stream runs, so each mode's
 * loop keeps its partial writes and completions as with a thread per stream (no state machine per mode).
 * A wait without a fresh EAGAIN polls the fd first, so an edge before it is never lost. A stream gives way
 * after one buffer (zc_check_deadline calls zc_fiber_share): round robin chunk by chunk, as iperf3 (longer
 * turns let one socket's queue fill in a burst while the others idle).
 * With every stream parked, a thread pinned to a CPU polls epoll up to ZC_MUX_SPIN_NS before it sleeps, while
 * polling pays: a sleep after each catch-up costs the peer a wake-up per chunk. An unpinned thread sleeps at
 * once (it may share its CPU with the very peer it waits for). At each switch the thread's RUSAGE_THREAD
 * time is credited to the stream that ran, so the streams' CPU adds up to the thread's.
 * docs/architecture.md "Parallel streams" has the design.
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
    int counting;                    /* the thread's CPU time accrues to its timed region (c->m) */
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

/* Credit the thread's CPU time since the last switch to the fiber it belongs to. */
static void accrue(zc_mux *m)
{
    struct rusage now;
    getrusage(RUSAGE_THREAD, &now);
    if (m->accrue && m->accrue->counting)
        zc_rusage_add(&m->accrue->c->m, &m->last, &now);
    m->last = now;
}

void zc_fiber_counting(zc_ctx *c, int on)
{
    accrue(c->fiber->mux);
    c->fiber->counting = on;
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

/* Every stream parked: epoll_wait up to timeout_ms, polling first while polling pays: a poll that sees nothing
 * stops polling until a sleep ends within 2 x ZC_MUX_SPIN_NS (one a poll would have covered). */
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

int zc_mux_prepare(zc_mux **out, zc_group *g, const int *idx, int n)
{
    zc_ctx *c0 = &g->ctx[idx[0]];
    zc_mux *m = *out = calloc(1, sizeof *m);
    if (m) {
        m->epfd = -1;
        m->n = n;
        m->fibers = calloc((size_t)n, sizeof *m->fibers);
    }
    if (!m || !m->fibers)
        return zc_fail(c0, ENOMEM, "out of memory for the thread's streams");
    m->spin_max = m->spin_ns = c0->p->ncpus > 0 || c0->p->cpu >= 0 ? ZC_MUX_SPIN_NS : 0; /* as zc_pin_cpu */
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

void zc_mux_run(zc_mux *m)
{
    tls_mux = m;
    schedule(m);
    accrue(m);
    tls_mux = NULL;
}

void zc_mux_free(zc_mux *m)
{
    if (!m)
        return;
    for (int i = 0; m->fibers && i < m->n; i++) {
        zc_fiber *f = &m->fibers[i];
        if (f->stack)
            munmap(f->stack, f->stack_len);
        if (f->c) /* NULL past a stream whose preparation failed */
            f->c->fiber = NULL;
    }
    free(m->fibers);
    if (m->epfd >= 0)
        close(m->epfd);
    free(m);
}
