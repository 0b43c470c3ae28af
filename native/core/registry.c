/* The one explicit list of compiled modes (as iperf3 lists its protocols). Adding a mode = one
 * file with its zc_mode_ops + one line here. Order is the order `zcorch worker info` reports. */
#include "zc_internal.h"

#include <string.h>

extern const zc_mode_ops zc_send_write_ops, zc_send_mmap_ops, zc_send_sendfile_ops, zc_send_splice_ops,
    zc_send_vmsplice_ops, zc_send_msg_zerocopy_ops;
extern const zc_mode_ops zc_recv_read_ops, zc_recv_mmap_ops, zc_recv_vmsplice_ops, zc_recv_splice_ops;

static const zc_mode_ops *const zc_modes[] = {
    &zc_send_write_ops,
    &zc_send_mmap_ops,
    &zc_send_sendfile_ops,
    &zc_send_splice_ops,
    &zc_send_vmsplice_ops,
    &zc_send_msg_zerocopy_ops,
    &zc_recv_read_ops,
    &zc_recv_mmap_ops,
    &zc_recv_vmsplice_ops,
    &zc_recv_splice_ops,
};

#define N_MODES (sizeof zc_modes / sizeof zc_modes[0])

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
