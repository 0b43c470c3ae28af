/* A group's metrics from its streams': each field combines as zcorch/params.py's Metric.combine says
 * (ZC_METRIC_COMBINE): sum, max, min, mean, first (stream 0's) or span (wall_ns and fsync_ns, measured by
 * the group itself). One stream's totals are its own metrics.
 */
#include "zc_core.h"

#include <string.h>

/* Folding stream i's value s->f into the total m->f, then finishing the total, per combine. */
#define ZC_FOLD_sum(f) m->f += s->f;
#define ZC_FOLD_mean(f) m->f += s->f;
#define ZC_FOLD_max(f) if (i == 0 || s->f > m->f) m->f = s->f;
#define ZC_FOLD_min(f) if (i == 0 || s->f < m->f) m->f = s->f;
#define ZC_FOLD_first(f) if (i == 0) m->f = s->f;
#define ZC_FOLD_span(f)
#define ZC_FINISH_mean(f) m->f /= g->n;
#define ZC_FINISH_sum(f)
#define ZC_FINISH_max(f)
#define ZC_FINISH_min(f)
#define ZC_FINISH_first(f)
#define ZC_FINISH_span(f)
#define ZC_FOLD(how, f) ZC_FOLD_##how(f)
#define ZC_FINISH(how, f) ZC_FINISH_##how(f)

void zc_group_totals(const zc_group *g, zc_metrics *m, int64_t wall_ns)
{
    memset(m, 0, sizeof *m);
    for (int i = 0; i < g->n; i++) {
        const zc_metrics *s = &g->ctx[i].m;
        ZC_METRIC_COMBINE(ZC_FOLD)
    }
    ZC_METRIC_COMBINE(ZC_FINISH)
    m->wall_ns = wall_ns;
}

/* With p->stream_metrics: each stream's own metrics, and with p->stream_offsets where its slice starts. */
void zc_group_stream_metrics(const zc_group *g, const zc_params *p)
{
    if (!p->stream_metrics)
        return;
    for (int i = 0; i < g->n; i++) {
        p->stream_metrics[i] = g->ctx[i].m;
        if (p->stream_offsets)
            p->stream_offsets[i] = g->ctx[i].base;
    }
}
