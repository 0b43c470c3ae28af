/* send mode "io_uring_zc": IORING_OP_SEND_ZC from registered buffers on the registered socket, --uring-depth
 * sub-blocks per linked chain (core/uring_send.c), each asking IORING_SEND_ZC_REPORT_USAGE: zc_completions
 * counts the notifications (IORING_CQE_F_NOTIF), zc_copied those the kernel copied after all, as msg_zerocopy
 * counts its completions. Needs Linux 6.0 (IORING_OP_SEND_ZC) and 6.2 (REPORT_USAGE): available() probes both.
 */
#include "zc_internal.h"
#include "zc_uring.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(ZC_HAVE_IO_URING) && defined(ZC_HAVE_IO_URING_SEND_ZC)

static void prep_zc(struct io_uring_sqe *sqe, int fd)
{
    sqe->opcode = IORING_OP_SEND_ZC;
    sqe->fd = fd; /* the ring's own fd: the issue fails with ENOTSOCK once the flags passed */
    sqe->ioprio = IORING_SEND_ZC_REPORT_USAGE;
}

static int available(char *why, size_t len)
{
    zc_uring r;
    if (!zc_uring_probe_ring(&r, why, len))
        return 0;
    static const int ops[] = {IORING_OP_SEND_ZC, IORING_OP_ASYNC_CANCEL};
    int missing = zc_uring_first_unsupported(&r, ops, 2);
    int ok = 0;
    if (missing == -2)
        snprintf(why, len, "the kernel's io_uring cannot be probed (IORING_REGISTER_PROBE, Linux 5.6 or later)");
    else if (missing >= 0)
        snprintf(why, len, "the kernel's io_uring has no IORING_OP_SEND_ZC (Linux 6.0 or later)");
    else if ((ok = zc_uring_flags_accepted(&r, prep_zc)) == 0)
        snprintf(why, len, "the kernel refuses IORING_SEND_ZC_REPORT_USAGE (Linux 6.2 or later), so it could not "
                           "say which sends it copied");
    else if (ok < 0)
        snprintf(why, len, "probing IORING_OP_SEND_ZC failed: %s", strerror(-ok));
    zc_uring_exit(&r);
    return ok == 1;
}

static int setup(zc_ctx *c) { return zc_uring_send_setup(c, 1); }

const zc_mode_ops zc_send_io_uring_zc_ops = {
    .name = "io_uring_zc",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_ZC_COMPLETIONS | ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING | ZC_CAP_REFILL,
    .available = available,
    .setup = setup,
    .connected = zc_uring_send_connected,
    .transfer = zc_uring_send_transfer,
    .teardown = zc_uring_send_teardown,
};

#else /* built without IORING_OP_SEND_ZC in <linux/io_uring.h>: listed, never run */

ZC_UNBUILT_MODE(zc_send_io_uring_zc_ops, "io_uring_zc", ZC_SIDE_SEND,
                ZC_CAP_ZC_COMPLETIONS | ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING, "io_uring", "io_uring_send_zc");

#endif
