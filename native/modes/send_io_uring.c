/* send mode "io_uring": IORING_OP_SEND on the registered socket, --uring-depth sub-blocks per submission as
 * one linked chain (the loop is core/uring_send.c, shared with io_uring_zc); plain buffers, as the kernel has
 * no registered-buffer IORING_OP_SEND. Needs io_uring with timed waits (Linux 5.11+) and IORING_OP_SEND:
 * available() probes a ring and says what is missing.
 */
#include "zc_internal.h"
#include "zc_uring.h"

#include <errno.h>
#include <stdio.h>

#ifdef ZC_HAVE_IO_URING

static int available(char *why, size_t len)
{
    zc_uring r;
    if (!zc_uring_probe_ring(&r, why, len))
        return 0;
    static const int ops[] = {IORING_OP_SEND, IORING_OP_ASYNC_CANCEL};
    int missing = zc_uring_first_unsupported(&r, ops, 2);
    zc_uring_exit(&r);
    if (missing == -2)
        snprintf(why, len, "the kernel's io_uring cannot be probed (IORING_REGISTER_PROBE, Linux 5.6 or later)");
    else if (missing >= 0)
        snprintf(why, len, "the kernel's io_uring has no IORING_OP_SEND (Linux 5.6 or later)");
    return missing == -1;
}

static int setup(zc_ctx *c) { return zc_uring_send_setup(c, 0); }

const zc_mode_ops zc_send_io_uring_ops = {
    .name = "io_uring",
    .side = ZC_SIDE_SEND,
    .caps = ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING | ZC_CAP_REFILL,
    .available = available,
    .setup = setup,
    .connected = zc_uring_send_connected,
    .transfer = zc_uring_send_transfer,
    .teardown = zc_uring_send_teardown,
};

#else /* built without <linux/io_uring.h>: listed, never run */

ZC_UNBUILT_MODE(zc_send_io_uring_ops, "io_uring", ZC_SIDE_SEND, ZC_CAP_KERNEL_FEATURE | ZC_CAP_URING, "io_uring");

#endif
