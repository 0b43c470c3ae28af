/* The compiled modes (as iperf3 lists its protocols), expanded from ZC_MODE_LIST (zc_params_gen.h: the
 * send_mode/recv_mode choices of zcorch/params.py, in the order `zcorch worker info` reports). Adding a mode =
 * native/modes/<side>_<name>.c filling zc_<side>_<name>_ops + its name among the choices. Also the capability
 * names, the availability query and the build features.
 */
#include "zc_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ZC_DECLARE_MODE(side, name) extern const zc_mode_ops zc_##side##_##name##_ops;
ZC_MODE_LIST(ZC_DECLARE_MODE)
#undef ZC_DECLARE_MODE

static const zc_mode_ops *const zc_modes[] = {
#define ZC_MODE_ENTRY(side, name) &zc_##side##_##name##_ops,
    ZC_MODE_LIST(ZC_MODE_ENTRY)
#undef ZC_MODE_ENTRY
};

#define N_MODES NELEM(zc_modes)

int zc_mode_count(int side)
{
    int n = 0;
    for (size_t i = 0; i < N_MODES; i++)
        n += zc_modes[i]->side == side;
    return n;
}

const char *zc_mode_name(int side, int index)
{
    for (size_t i = 0; i < N_MODES; i++)
        if (zc_modes[i]->side == side && index-- == 0)
            return zc_modes[i]->name;
    return NULL;
}

const zc_mode_ops *zc_find_mode(int side, const char *name)
{
    for (size_t i = 0; name && i < N_MODES; i++)
        if (zc_modes[i]->side == side && strcmp(zc_modes[i]->name, name) == 0)
            return zc_modes[i];
    return NULL;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char *zc_modes_with(unsigned cap, char *buf, size_t len)
{
    const char *names[N_MODES];
    size_t n = 0;
    for (size_t i = 0; i < N_MODES; i++)
        if (zc_modes[i]->caps & cap)
            names[n++] = zc_modes[i]->name;
    qsort(names, n, sizeof names[0], by_name);
    size_t off = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && off < len; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
            off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "/" : "", names[i]);
    return buf;
}

/* Stable names: they reach Python, the worker's info event and the planner; never rename one. */
static const char *const zc_cap_names[] = {
    "file_source", "mappable_source", "file_sink", "pipe", "gift", "zc_completions", "kernel_feature",
    "no_sink", "zc_recv", "uring", "one_stream", "grain", "refill",
};

_Static_assert(ZC_CAP_ALL == (1u << NELEM(zc_cap_names)) - 1,
               "every ZC_CAP_* bit needs a name in zc_cap_names");

const char *zc_cap_name(unsigned bit)
{
    for (unsigned i = 0; i < NELEM(zc_cap_names); i++)
        if (bit == 1u << i)
            return zc_cap_names[i];
    return NULL;
}

unsigned zc_mode_caps(int side, const char *name)
{
    const zc_mode_ops *m = zc_find_mode(side, name);
    return m ? m->caps : 0;
}

int zc_mode_available(int side, const char *name, char *why, size_t len)
{
    const zc_mode_ops *m = zc_find_mode(side, name);
    if (len)
        why[0] = '\0';
    if (!m)
        return -1;
    if (!(m->caps & ZC_CAP_KERNEL_FEATURE))
        return 1;
    if (!m->available) { /* a declaration without its probe: say so rather than guess */
        if (len)
            snprintf(why, len, "declares a kernel feature but has no probe (bug)");
        return 0;
    }
    return m->available(why, len) ? 1 : 0;
}

/* What native/build.py's feature probes found: ZC_HAVE_<NAME> when the host's headers have it, else
 * ZC_LACKS_<NAME> = why not (a build without build.py, e.g. a hand-made one, lacks everything). */
#ifdef ZC_HAVE_IO_URING
#define ZC_WHY_IO_URING NULL
#elif defined(ZC_LACKS_IO_URING)
#define ZC_WHY_IO_URING ZC_LACKS_IO_URING
#else
#define ZC_WHY_IO_URING "this worker was built without native/build.py's feature probes"
#endif
#ifdef ZC_HAVE_IO_URING_SEND_ZC
#define ZC_WHY_IO_URING_SEND_ZC NULL
#elif defined(ZC_LACKS_IO_URING_SEND_ZC)
#define ZC_WHY_IO_URING_SEND_ZC ZC_LACKS_IO_URING_SEND_ZC
#else
#define ZC_WHY_IO_URING_SEND_ZC "this worker was built without native/build.py's feature probes"
#endif
#ifdef ZC_HAVE_IO_URING_PBUF_RING
#define ZC_WHY_IO_URING_PBUF_RING NULL
#elif defined(ZC_LACKS_IO_URING_PBUF_RING)
#define ZC_WHY_IO_URING_PBUF_RING ZC_LACKS_IO_URING_PBUF_RING
#else
#define ZC_WHY_IO_URING_PBUF_RING "this worker was built without native/build.py's feature probes"
#endif
#ifdef ZC_HAVE_TCP_ZEROCOPY_RECEIVE
#define ZC_WHY_TCP_ZEROCOPY_RECEIVE NULL
#elif defined(ZC_LACKS_TCP_ZEROCOPY_RECEIVE)
#define ZC_WHY_TCP_ZEROCOPY_RECEIVE ZC_LACKS_TCP_ZEROCOPY_RECEIVE
#else
#define ZC_WHY_TCP_ZEROCOPY_RECEIVE "this worker was built without native/build.py's feature probes"
#endif

static const struct {
    const char *name, *missing;
} zc_features[] = {
    {"io_uring", ZC_WHY_IO_URING},
    {"io_uring_send_zc", ZC_WHY_IO_URING_SEND_ZC},
    {"io_uring_pbuf_ring", ZC_WHY_IO_URING_PBUF_RING},
    {"tcp_zerocopy_receive", ZC_WHY_TCP_ZEROCOPY_RECEIVE},
};

const char *zc_build_feature_name(int index)
{
    return index >= 0 && (size_t)index < NELEM(zc_features) ? zc_features[index].name : NULL;
}

const char *zc_build_feature_missing(int index)
{
    return index >= 0 && (size_t)index < NELEM(zc_features) ? zc_features[index].missing : NULL;
}

const char *zc_build_missing_any(const char *const *features)
{
    for (; *features; features++) {
        size_t i = 0;
        while (i < NELEM(zc_features) && strcmp(zc_features[i].name, *features) != 0)
            i++;
        if (i == NELEM(zc_features))
            return "unknown build feature (bug)";
        if (zc_features[i].missing)
            return zc_features[i].missing;
    }
    return NULL;
}
