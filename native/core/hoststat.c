/* Host-wide counters and per-interval samples around the timed region (zc_params.watch).
 * Snapshots: the texts of /proc/stat, /proc/softirqs, /proc/net/snmp and /proc/vmstat, opened beforehand and
 * copied right before the timed region (/proc/stat last) and right after it (/proc/stat first), so /proc/stat
 * brackets the transfer tightly; zcorch/worker/hoststat.py parses them after the run.
 * Samples: a thread waking on each interval's deadline (a CLOCK_MONOTONIC condition variable, so it stops at
 * once) records bytes moved (every stream's c->done, read relaxed), process CPU, /proc/stat's "cpu" line and
 * TCP_INFO into the caller's array: no mode's loop changes or pays for it.
 */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *const host_files[ZC_HOST_NFILES] = {"/proc/stat", "/proc/softirqs", "/proc/net/snmp",
                                                       "/proc/vmstat"};

struct zc_watch_state {
    zc_ctx *c;
    zc_watch *w;
    int fds[ZC_HOST_NFILES];
    int stat_fd;                 /* the sampler's own /proc/stat */
    int64_t t0_ns;
    int64_t cpu0_ns;
    int64_t busy0, softirq0, idle0;
    int64_t interval_ns;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int stop;
};

/* Read a whole /proc file from offset 0 into buf (at most cap bytes); -1 with errno, ENOBUFS if it did not fit. */
static ssize_t read_whole(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    for (;;) {
        if (got == cap) {
            errno = ENOBUFS;
            return -1;
        }
        ssize_t n = pread(fd, buf + got, cap - got, (off_t)got);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0)
            return (ssize_t)got;
        got += (size_t)n;
    }
}

static void read_one(struct zc_watch_state *ws, zc_host_snap *s, int i, size_t *off)
{
    s->len[i] = 0;
    if (ws->fds[i] < 0) {
        s->err[i] = s->err[i] ? s->err[i] : ENOENT;
        return;
    }
    ssize_t n = read_whole(ws->fds[i], s->buf + *off, s->cap - *off);
    if (n < 0) {
        s->err[i] = errno;
        return;
    }
    s->err[i] = 0;
    s->len[i] = (size_t)n;
    *off += (size_t)n;
}

/* before: the other files first, /proc/stat last; after: /proc/stat first (off[] says where each text is). */
static void snapshot(struct zc_watch_state *ws, zc_host_snap *s, int stat_last)
{
    static const int before_order[ZC_HOST_NFILES] = {1, 2, 3, 0}, after_order[ZC_HOST_NFILES] = {0, 1, 2, 3};
    const int *order = stat_last ? before_order : after_order;
    if (!s->buf)
        return;
    size_t pos = 0;
    for (int k = 0; k < ZC_HOST_NFILES; k++) {
        int i = order[k];
        s->off[i] = pos;
        read_one(ws, s, i, &pos);
        if (i == 0)
            s->at_ns = zc_now_ns();
    }
}

/* The "cpu" line of /proc/stat: busy, softirq and idle+iowait ticks; 0 on success. */
static int stat_totals(int fd, int64_t *busy, int64_t *softirq, int64_t *idle)
{
    char buf[512];
    ssize_t n;
    do
        n = pread(fd, buf, sizeof buf - 1, 0);
    while (n < 0 && errno == EINTR);
    if (n <= 4)
        return -1;
    buf[n] = '\0';
    if (strncmp(buf, "cpu ", 4) != 0)
        return -1;
    /* user nice system idle iowait irq softirq steal [guest guest_nice]: guest is already in user */
    int64_t v[8] = {0};
    char *p = buf + 4, *end;
    for (int i = 0; i < 8; i++) {
        long long x = strtoll(p, &end, 10);
        if (end == p)
            break; /* older kernels have fewer columns: the rest stay 0 */
        v[i] = x;
        p = end;
    }
    /* steal (v[7]) is the hypervisor running other guests: not this kernel's work (zcorch.params) */
    *busy = v[0] + v[1] + v[2] + v[5] + v[6];
    *softirq = v[6];
    *idle = v[3] + v[4];
    return 0;
}

static int64_t proc_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) < 0)
        return 0;
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void take_sample(struct zc_watch_state *ws)
{
    zc_watch *w = ws->w;
    if (w->n_samples >= w->samples_cap) {
        w->samples_dropped = 1;
        return;
    }
    zc_sample *s = &w->samples[w->n_samples];
    memset(s, 0, sizeof *s);
    s->t_ns = zc_now_ns() - ws->t0_ns;
    int n = zc_group_size(ws->c); /* parallel streams: bytes summed, TCP_INFO combined as group_totals does */
    s->bytes = 0;
    for (int i = 0; i < n; i++)
        s->bytes += __atomic_load_n(&zc_group_stream(ws->c, i)->done, __ATOMIC_RELAXED);
    s->proc_cpu_ns = proc_cpu_ns() - ws->cpu0_ns;
    int64_t busy, softirq, idle;
    if (ws->stat_fd >= 0 && stat_totals(ws->stat_fd, &busy, &softirq, &idle) == 0) {
        s->host_busy_ticks = busy - ws->busy0;
        s->host_softirq_ticks = softirq - ws->softirq0;
        s->host_idle_ticks = idle - ws->idle0;
    } else {
        s->host_busy_ticks = s->host_softirq_ticks = s->host_idle_ticks = -1;
    }
    int64_t cwnd = 0, rtt = 0, retrans = 0;
    int got = 0;
    for (int i = 0; i < n; i++) {
        int sock = __atomic_load_n(&zc_group_stream(ws->c, i)->sock, __ATOMIC_RELAXED);
        struct tcp_info ti;
        socklen_t l = sizeof ti;
        memset(&ti, 0, sizeof ti);
        if (sock >= 0 && getsockopt(sock, IPPROTO_TCP, TCP_INFO, &ti, &l) == 0) {
            cwnd += ti.tcpi_snd_cwnd; /* summed over the streams */
            rtt += ti.tcpi_rtt;       /* averaged */
            retrans += ti.tcpi_total_retrans;
            got++;
        }
    }
    if (got) {
        s->tcp_snd_cwnd = cwnd;
        s->tcp_rtt_us = rtt / got;
        s->tcp_total_retrans = retrans;
    } else {
        s->tcp_snd_cwnd = s->tcp_rtt_us = s->tcp_total_retrans = -1;
    }
    w->n_samples++;
}

static void *sampler(void *arg)
{
    struct zc_watch_state *ws = arg;
    int64_t next = ws->t0_ns + ws->interval_ns;
    pthread_mutex_lock(&ws->mu);
    while (!ws->stop) {
        struct timespec ts = {.tv_sec = next / 1000000000LL, .tv_nsec = next % 1000000000LL};
        int rc = pthread_cond_timedwait(&ws->cv, &ws->mu, &ts);
        if (ws->stop)
            break;
        if (rc != ETIMEDOUT && zc_now_ns() < next)
            continue; /* spurious wake-up */
        pthread_mutex_unlock(&ws->mu);
        take_sample(ws);
        pthread_mutex_lock(&ws->mu);
        next += ws->interval_ns;
        int64_t now = zc_now_ns();
        if (next <= now) /* a late wake-up (a busy CPU): keep to the grid, skip what was missed */
            next += ((now - next) / ws->interval_ns + 1) * ws->interval_ns;
    }
    pthread_mutex_unlock(&ws->mu);
    return NULL;
}

static int start_sampler(struct zc_watch_state *ws)
{
    pthread_condattr_t ca;
    int rc = pthread_condattr_init(&ca);
    if (rc == 0)
        rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(&ws->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (rc != 0)
        return rc;
    pthread_mutex_init(&ws->mu, NULL);
    rc = pthread_create(&ws->thread, NULL, sampler, ws);
    if (rc != 0) {
        pthread_cond_destroy(&ws->cv);
        pthread_mutex_destroy(&ws->mu);
        return rc;
    }
    ws->thread_started = 1;
    return 0;
}

void zc_watch_begin(zc_ctx *c)
{
    zc_watch *w = c->p->watch;
    c->watch_state = NULL;
    if (!w)
        return;
    w->n_samples = 0;
    w->samples_dropped = 0;
    w->sampler_err = 0;
    struct zc_watch_state *ws = calloc(1, sizeof *ws);
    if (!ws) {
        w->sampler_err = ENOMEM;
        for (int i = 0; i < ZC_HOST_NFILES; i++)
            w->before.err[i] = w->after.err[i] = ENOMEM;
        return;
    }
    ws->c = c;
    ws->w = w;
    ws->stat_fd = -1;
    for (int i = 0; i < ZC_HOST_NFILES; i++) {
        ws->fds[i] = open(host_files[i], O_RDONLY | O_CLOEXEC);
        w->before.err[i] = w->after.err[i] = ws->fds[i] < 0 ? errno : 0;
    }
    int sampling = w->interval_s > 0 && w->samples && w->samples_cap > 0;
    if (sampling) {
        ws->interval_ns = (int64_t)(w->interval_s * 1e9);
        if (ws->interval_ns < 1000000)
            ws->interval_ns = 1000000; /* at most 1000 samples a second */
        ws->stat_fd = open("/proc/stat", O_RDONLY | O_CLOEXEC);
        if (ws->stat_fd < 0 || stat_totals(ws->stat_fd, &ws->busy0, &ws->softirq0, &ws->idle0) < 0) {
            if (ws->stat_fd >= 0)
                close(ws->stat_fd);
            ws->stat_fd = -1;
        }
    }
    snapshot(ws, &w->before, 1);
    ws->cpu0_ns = proc_cpu_ns();
    ws->t0_ns = zc_now_ns();
    if (sampling) {
        int rc = start_sampler(ws);
        if (rc != 0)
            w->sampler_err = rc;
    }
    c->watch_state = ws;
}

void zc_watch_end(zc_ctx *c)
{
    struct zc_watch_state *ws = c->watch_state;
    if (!ws)
        return;
    snapshot(ws, &ws->w->after, 0);
    if (ws->thread_started) {
        pthread_mutex_lock(&ws->mu);
        ws->stop = 1;
        pthread_cond_signal(&ws->cv);
        pthread_mutex_unlock(&ws->mu);
        pthread_join(ws->thread, NULL);
        pthread_cond_destroy(&ws->cv);
        pthread_mutex_destroy(&ws->mu);
        take_sample(ws); /* the end of the transfer: the last, partial interval */
    }
    for (int i = 0; i < ZC_HOST_NFILES; i++)
        if (ws->fds[i] >= 0)
            close(ws->fds[i]);
    if (ws->stat_fd >= 0)
        close(ws->stat_fd);
    free(ws);
    c->watch_state = NULL;
}
