/* The streams of one run (--streams N; one stream is a group of one): their contexts, the threads that run
 * their timed transfers behind one gate, and which failure explains the run. Stream i moves its own slice of
 * the source to the same offsets of the sink (zc_stream_slice), so the sink is the one-stream file. Set-up is
 * the calling thread's (lifecycle.c); the threads pin themselves, wait at the gate, then run: stream i on
 * thread i mod --threads, alone with blocking calls or multiplexed with others (mux.c).
 */
#include "zc_core.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int distinct_cpus(const zc_params *p)
{
    int k = 0;
    for (int i = 0; i < p->ncpus; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = p->cpus[j] == p->cpus[i];
        k += !seen;
    }
    return k;
}

int zc_threads_effective(const zc_params *p)
{
    int n = p->streams > 0 ? p->streams : 1, t = p->threads;
    if (t <= 0) {
        if (p->ncpus > 0 && p->cpus) {
            t = distinct_cpus(p);
        } else if (p->cpu >= 0) {
            t = 1;
        } else {
            cpu_set_t set;
            t = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : n;
            if (t > n)
                t = n;
        }
    }
    if (t > n)
        t = n;
    return t < 1 ? 1 : t;
}

static void free_arrays(zc_group *g)
{
    free(g->ctx);
    free(g->params);
    free(g->errs);
    free(g->rc);
    free(g->tfail);
    free(g);
}

zc_group *zc_group_new(const zc_params *p, zc_error *err)
{
    int n = p->streams > 0 ? p->streams : 1;
    zc_group *g = calloc(1, sizeof *g);
    if (g) {
        g->n = n;
        g->ctx = calloc((size_t)n, sizeof *g->ctx);
        g->params = calloc((size_t)n, sizeof *g->params);
        g->errs = calloc((size_t)n, sizeof *g->errs);
        g->rc = calloc((size_t)n, sizeof *g->rc);
        g->tfail = calloc((size_t)n, sizeof *g->tfail);
    }
    if (!g || !g->ctx || !g->params || !g->errs || !g->rc || !g->tfail) {
        if (g)
            free_arrays(g);
        err->code = ENOMEM;
        snprintf(err->message, sizeof err->message, "%s: out of memory for %d streams",
                 p->side == ZC_SIDE_SEND ? "send" : "recv", n);
        return NULL;
    }
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->cond, NULL);
    g->nthreads = zc_threads_effective(p);
    for (int i = 0; i < n; i++) {
        g->params[i] = *p;                /* --fsync: the group fsyncs the sink once, after every stream */
        g->params[i].stream_metrics = NULL;
        g->params[i].stream_offsets = NULL;
        zc_ctx_init(&g->ctx[i], &g->params[i], &g->errs[i]);
        g->ctx[i].stream = i;
        g->ctx[i].nstreams = n;
        g->ctx[i].group = g;
        /* thread i % T runs streams i, i + T, ...: shared when there is a next one or a previous one */
        g->ctx[i].shared = i + g->nthreads < n || i >= g->nthreads;
    }
    return g;
}

void zc_group_free(zc_group *g)
{
    for (int i = g->n - 1; i >= 0; i--) /* stream 0 last: the others may use its pattern ring until then */
        zc_ctx_cleanup(&g->ctx[i]);
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    free_arrays(g);
}

/* The error of the stream that failed first (in time; set-up failures come in stream order): as it is
 * with one stream, else as "<side> <mode>: stream i of n: <what>"; 0 if none failed. */
int zc_group_error(zc_group *g, zc_error *err)
{
    int first = -1;
    for (int i = 0; i < g->n; i++)
        if (g->rc[i] != 0 && (first < 0 || g->tfail[i] < g->tfail[first]))
            first = i;
    if (first < 0)
        return 0;
    err->code = g->errs[first].code ? g->errs[first].code : EIO;
    const char *msg = g->errs[first].message;
    if (g->n == 1) {
        snprintf(err->message, sizeof err->message, "%s", msg);
        return -1;
    }
    const char *rest = strstr(msg, ": ");
    int head = rest ? (int)(rest - msg) : 0;
    char tail[sizeof err->message];
    snprintf(tail, sizeof tail, "%s", rest ? rest + 2 : msg);
    int k = snprintf(err->message, sizeof err->message, "%.*s: stream %d of %d: ", head, msg, first, g->n);
    if (k > 0 && (size_t)k < sizeof err->message)
        snprintf(err->message + k, sizeof err->message - (size_t)k, "%.*s",
                 (int)(sizeof err->message - (size_t)k - 1), tail);
    return -1;
}

/* What one thread runs: streams first, first + stride, ... (count of them) of its group. */
typedef struct zc_thread {
    zc_group *g;
    int first, count, stride;
    pthread_t tid;
} zc_thread;

/* Every stream of the thread fails as `why` did (a thread that could not pin or ready its streams). */
static void fail_all(zc_thread *t, const zc_error *why, int64_t when)
{
    zc_group *g = t->g;
    for (int k = 0, i = t->first; k < t->count; k++, i += t->stride) {
        if (&g->errs[i] != why)
            g->errs[i] = *why;
        g->rc[i] = -1;
        g->tfail[i] = when;
    }
}

/* A thread: pin (as thread `first` of the group), ready its streams, wait at the gate, run them. */
static void *thread_main(void *arg)
{
    zc_thread *t = arg;
    zc_group *g = t->g;
    zc_ctx *c0 = &g->ctx[t->first];
    int rc = zc_pin_cpu(c0, t->first);
    zc_mux *mux = NULL;
    int idx[256]; /* the table caps --streams at 256 */
    int n = 0;
    for (int i = t->first; n < t->count && n < (int)(sizeof idx / sizeof idx[0]); i += t->stride)
        idx[n++] = i;
    const zc_error *why = c0->err;
    if (rc == 0 && n > 1 && zc_mux_prepare(&mux, g, idx, n) < 0) {
        rc = -1;
        for (int k = 0; k < n; k++)
            if (g->ctx[idx[k]].err->code) {
                why = g->ctx[idx[k]].err;
                break;
            }
    }
    pthread_mutex_lock(&g->lock);
    while (g->go == 0)
        pthread_cond_wait(&g->cond, &g->lock);
    int go = g->go;
    pthread_mutex_unlock(&g->lock);
    if (go < 0) {
        for (int k = 0; k < n; k++) {
            g->rc[idx[k]] = zc_fail(&g->ctx[idx[k]], EAGAIN, "another stream's thread could not be created");
            g->tfail[idx[k]] = INT64_MAX;
        }
    } else if (rc < 0) {
        fail_all(t, why, zc_now_ns());
    } else if (mux) {
        zc_mux_run(mux);
    } else {
        rc = zc_stream_transfer(c0);
        g->rc[t->first] = rc;
        g->tfail[t->first] = rc ? zc_now_ns() : 0;
    }
    zc_mux_free(mux);
    return NULL;
}

/* The streams of c's group: the host sampler (hoststat.c) sums their bytes. */
int zc_group_size(const zc_ctx *c) { return c->group ? c->group->n : 1; }
const zc_ctx *zc_group_stream(const zc_ctx *c, int i) { return c->group ? &c->group->ctx[i] : c; }

/* Start the threads, open the gate, wait for all; the group's timed span in t0, t1. The host watch begins once,
 * on ctx[0], just before the gate opens; the caller ends it after the span (the receiver after its fsync). */
void zc_group_run(zc_group *g, int64_t *t0, int64_t *t1)
{
    int nthreads = g->nthreads, started = 0;
    zc_thread *th = calloc((size_t)nthreads, sizeof *th);
    *t0 = *t1 = 0;
    if (!th) {
        for (int i = 0; i < g->n; i++)
            g->rc[i] = zc_fail(&g->ctx[i], ENOMEM, "out of memory for the stream threads");
        return;
    }
    for (; started < nthreads; started++) {
        int count = g->n / nthreads + (started < g->n % nthreads);
        th[started] = (zc_thread){.g = g, .first = started, .count = count, .stride = nthreads};
        int e = pthread_create(&th[started].tid, NULL, thread_main, &th[started]);
        if (e) {
            errno = e;
            zc_fail_errno(&g->ctx[started], "pthread_create for stream %d", started);
            fail_all(&th[started], g->ctx[started].err, zc_now_ns());
            break;
        }
    }
    if (started == nthreads)
        zc_watch_begin(&g->ctx[0]);
    pthread_mutex_lock(&g->lock);
    g->go = started == nthreads ? 1 : -1;
    pthread_cond_broadcast(&g->cond);
    pthread_mutex_unlock(&g->lock);
    for (int i = 0; i < started; i++)
        pthread_join(th[i].tid, NULL);
    free(th);
    *t0 = INT64_MAX;
    for (int i = 0; i < g->n; i++) {
        if (g->ctx[i].t0_ns && g->ctx[i].t0_ns < *t0)
            *t0 = g->ctx[i].t0_ns;
        if (g->ctx[i].t1_ns > *t1)
            *t1 = g->ctx[i].t1_ns;
    }
    if (*t0 == INT64_MAX)
        *t0 = *t1;
}
