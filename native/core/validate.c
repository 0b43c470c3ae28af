/* The parameters' checks, before anything is opened: the parameter table's limits, the mode, and the cell
 * rules on what it declares, worded by zcorch/params.py (zc_params_gen.h) as the planner words them.
 */
#include "zc_core.h"

#include <errno.h>
#include <string.h>

void zc_params_init(zc_params *p)
{
    memset(p, 0, sizeof *p);
#define ZC_DEFAULT(field, value) p->field = value;
    ZC_PARAM_DEFAULTS(ZC_DEFAULT)
#undef ZC_DEFAULT
}

/* "<flag>: expected ... between <min> and <max>, got <value>" for the first field out of its limits */
static int check_limits(zc_ctx *c)
{
    const zc_params *p = c->p;
#define ZC_OUT(field, lo, hi, has_unset, unset) \
    (!((has_unset) && p->field == (unset)) && !(p->field >= (lo) && p->field <= (hi)))
#define ZC_CHECK_INT(field, flag, lo, hi, has_unset, unset, limits)                                   \
    if (ZC_OUT(field, lo, hi, has_unset, unset))                                                        \
        return zc_fail(c, EINVAL, flag ": " limits ", got %lld", (long long)p->field);
#define ZC_CHECK_U64(field, flag, lo, hi, has_unset, unset, limits)                                   \
    if (ZC_OUT(field, (uint64_t)(lo), (uint64_t)(hi), has_unset, (uint64_t)(unset)))                  \
        return zc_fail(c, EINVAL, flag ": " limits ", got %llu", (unsigned long long)p->field);
#define ZC_CHECK_DOUBLE(field, flag, lo, hi, has_unset, unset, limits)                                \
    if (ZC_OUT(field, lo, hi, has_unset, unset))                                                        \
        return zc_fail(c, EINVAL, flag ": " limits ", got %.9gs", p->field);
    ZC_PARAM_LIMITS_INT(ZC_CHECK_INT)
    ZC_PARAM_LIMITS_U64(ZC_CHECK_U64)
    ZC_PARAM_LIMITS_DOUBLE(ZC_CHECK_DOUBLE)
#undef ZC_CHECK_DOUBLE
#undef ZC_CHECK_U64
#undef ZC_CHECK_INT
#undef ZC_OUT
    return 0;
}

static int find_mode(zc_ctx *c, int side)
{
    const zc_params *p = c->p;
    c->ops = zc_find_mode(side, p->mode);
    if (!c->ops) {
        char names[256] = "";
        for (int i = 0; i < zc_mode_count(side); i++) {
            if (i)
                strncat(names, ", ", sizeof names - strlen(names) - 1);
            strncat(names, zc_mode_name(side, i), sizeof names - strlen(names) - 1);
        }
        return zc_fail(c, EINVAL, "unknown %s mode (this build has: %s)", side == ZC_SIDE_SEND ? "send" : "receive",
                       names);
    }
    char why[256];
    if (zc_mode_available(side, p->mode, why, sizeof why) != 1)
        return zc_fail(c, EOPNOTSUPP, "cannot run on this kernel: %s", why);
    return 0;
}

int zc_validate_ctx(zc_ctx *c, int side)
{
    const zc_params *p = c->p;
    if (p->side != side)
        return zc_fail(c, EINVAL, "parameters are for the other side");
    if (find_mode(c, side) < 0 || check_limits(c) < 0)
        return -1;
    if ((uint64_t)p->subblocks > p->buffer)
        return zc_fail(c, EINVAL, ZC_RULE_SUBBLOCKS, p->subblocks, "buffer", (unsigned long long)p->buffer);
#define ZC_CHECK_CHOICE(field, flag, count)                                                           \
    if (p->field < 0 || p->field >= (count))                                                          \
        return zc_fail(c, EINVAL, "unknown " flag " %d", p->field);
    ZC_PARAM_CHOICES(ZC_CHECK_CHOICE)
#undef ZC_CHECK_CHOICE
    /* the cell rules on parameters alone (those on the files are judged on their descriptors when opened) */
    const char *mode = c->ops->name;
    unsigned caps = c->ops->caps;
    char only[128];
    int src_mem = !p->source || !*p->source || strcmp(p->source, "mem") == 0;
    if (side == ZC_SIDE_SEND && src_mem && (caps & (ZC_CAP_FILE_SOURCE | ZC_CAP_MAPPABLE_SOURCE)))
        return zc_fail(c, EOPNOTSUPP, ZC_RULE_FILE_SOURCE, mode);
    int mmap_set = p->mmap_grain != ZC_MMAP_GRAIN_WHOLE, splice_set = p->splice_grain != ZC_SPLICE_GRAIN_SUBBLOCK;
    if ((mmap_set || splice_set) && !(caps & ZC_CAP_GRAIN))
        return zc_fail(c, EINVAL, ZC_RULE_GRAIN,
                       mmap_set && splice_set ? "`mmap_grain` and `splice_grain`" : mmap_set ? "`mmap_grain`"
                                                                                       : "`splice_grain`",
                       mode, zc_modes_with(ZC_CAP_GRAIN, only, sizeof only));
    if (p->mmap_grain == ZC_MMAP_GRAIN_SUBBLOCK && src_mem && !p->gift)
        return zc_fail(c, EINVAL, ZC_RULE_GRAIN_NEEDS_GIFT);
    if (p->refill && !(caps & ZC_CAP_REFILL))
        return zc_fail(c, EINVAL, ZC_RULE_REFILL, mode, zc_modes_with(ZC_CAP_REFILL, only, sizeof only));
    if (p->refill && !src_mem)
        return zc_fail(c, EINVAL, ZC_RULE_REFILL_NEEDS_MEM, p->source);
    if (!p->refill && p->fill != ZC_FILL_PATTERN)
        return zc_fail(c, EINVAL, ZC_RULE_FILL_NEEDS_REFILL, "rand_crc32");
    if (p->streams > 1 && (caps & ZC_CAP_ONE_STREAM))
        return zc_fail(c, EOPNOTSUPP, ZC_RULE_ONE_STREAM, side == ZC_SIDE_SEND ? "send" : "receive", mode,
                       p->streams);
    unsigned char nonce[ZC_NONCE_LEN];
    if (zc_nonce_bytes(p->nonce, nonce) < 0)
        return zc_fail(c, EINVAL, "--nonce: expected %d hexadecimal digits, got '%.80s'", 2 * ZC_NONCE_LEN, p->nonce);
    if (p->ncpus < 0 || (p->ncpus > 0 && !p->cpus))
        return zc_fail(c, EINVAL, "--cpus: bad CPU list");
    for (int i = 0; i < p->ncpus; i++)
        if (p->cpus[i] < ZC_MIN_CPU || p->cpus[i] > ZC_MAX_CPU)
            return zc_fail(c, EINVAL, "--cpus: CPU %d is out of range (%d..%d)", p->cpus[i], ZC_MIN_CPU, ZC_MAX_CPU);
    c->buffer = (size_t)p->buffer;
    c->sub = (c->buffer + (size_t)p->subblocks - 1) / (size_t)p->subblocks;
    return 0;
}

int zc_validate(const zc_params *p, zc_error *err)
{
    zc_ctx c;
    zc_ctx_init(&c, p, err);
    int side = p->side == ZC_SIDE_RECV ? ZC_SIDE_RECV : ZC_SIDE_SEND;
    return zc_validate_ctx(&c, side);
}
