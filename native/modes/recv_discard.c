/* recv mode "discard": recv(MSG_TRUNC) with no buffer, so TCP drops what arrived without the copy out of the
 * socket (iperf3's --skip-rx-copy): the receiver's upper bound. Nothing is kept, so the sink must be /dev/null.
 * A kernel that does not discard would copy into the NULL buffer (EFAULT): available() tries it on loopback.
 */
#include "zc_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* A loopback TCP connection: listener, client, accepted end */
static int probe_pair(int fds[3], char *why, size_t len)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    const char *step = "no loopback listener";
    fds[1] = fds[2] = -1;
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fds[0] >= 0 && bind(fds[0], (struct sockaddr *)&a, sizeof a) == 0 && listen(fds[0], 1) == 0 &&
        getsockname(fds[0], (struct sockaddr *)&a, &al) == 0) {
        step = "loopback connect failed";
        fds[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[1] >= 0 && connect(fds[1], (struct sockaddr *)&a, sizeof a) == 0) {
            step = "accept failed";
            if ((fds[2] = accept4(fds[0], NULL, NULL, SOCK_CLOEXEC)) >= 0)
                return 0;
        }
    }
    snprintf(why, len, "cannot probe recv(MSG_TRUNC) on TCP: %s (%s)", step, strerror(errno));
    return -1;
}

/* Two bytes over loopback, one discarded by recv(NULL, 1, MSG_TRUNC): the other must still be there */
static int available(char *why, size_t len)
{
    int fds[3];
    int ok = 0;
    if (probe_pair(fds, why, len) == 0) {
        struct pollfd pfd = {.fd = fds[2], .events = POLLIN};
        char got = 0;
        ssize_t n;
        if (send(fds[1], "ab", 2, MSG_NOSIGNAL) != 2) {
            snprintf(why, len, "cannot probe recv(MSG_TRUNC) on TCP: send failed (%s)", strerror(errno));
        } else if (poll(&pfd, 1, 2000) != 1) {
            snprintf(why, len, "cannot probe recv(MSG_TRUNC) on TCP: loopback data did not arrive");
        } else if ((n = recv(fds[2], NULL, 1, MSG_TRUNC | MSG_DONTWAIT)) != 1) {
            if (n < 0 && errno == EFAULT)
                snprintf(why, len, "this kernel does not discard TCP data with recv(MSG_TRUNC) (it tried to copy "
                                   "into the missing buffer: EFAULT)");
            else
                snprintf(why, len, "recv(MSG_TRUNC) on TCP returned %zd (%s), not 1", n,
                         n < 0 ? strerror(errno) : "a short count");
        } else if (recv(fds[2], &got, 1, MSG_DONTWAIT) != 1 || got != 'b') {
            snprintf(why, len, "recv(MSG_TRUNC) on TCP did not discard exactly the byte asked for");
        } else {
            ok = 1;
        }
    }
    for (int i = 0; i < 3; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return ok;
}

static int setup(zc_ctx *c)
{
    struct stat st;
    if (fstat(c->fd, &st) < 0)
        return zc_fail_errno(c, "fstat of the sink");
    if (!(S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3)))
        return zc_fail(c, EOPNOTSUPP, ZC_RULE_NO_SINK, c->ops->name, c->p->sink);
    return 0;
}

static int transfer(zc_ctx *c)
{
    for (;;) {
        if (zc_check_deadline(c, "receiving") < 0)
            return -1;
        size_t want = zc_recv_want(c, c->sub);
        if (want == 0)
            return 0;
        ssize_t n = recv(c->sock, NULL, want, MSG_TRUNC);
        if (n > 0) {
            c->done += (uint64_t)n;
            continue;
        }
        if (n == 0)
            return 0;
        if (zc_io_retry(c, "discarding from the socket", "recv(MSG_TRUNC) from the socket") < 0)
            return -1;
    }
}

const zc_mode_ops zc_recv_discard_ops = {
    .name = "discard",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_NO_SINK | ZC_CAP_KERNEL_FEATURE,
    .available = available,
    .setup = setup,
    .transfer = transfer,
};
