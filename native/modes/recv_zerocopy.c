/* recv mode "zerocopy_recv": TCP_ZEROCOPY_RECEIVE as the kernel's selftest tcp_mmap.c does: a window of one
 * buffer mmap()ed from the socket; each getsockopt(TCP_ZEROCOPY_RECEIVE) maps whole pages of the receive queue
 * into it (zc_recv_mapped), and what cannot be mapped (recv_skip_hint) is read() (zc_recv_copied); then the
 * data is write()n to the sink and the window zapped. SO_RCVLOWAT of one window gathers data into windows.
 * Segments must carry whole pages: setup() sets TCP_MAXSEG on the listening socket to the most pages (plus the
 * timestamp option) the interface's MTU carries (--tcp-maxseg overrides), and a link or connection that
 * cannot carry one page is refused. Over loopback/veth only pages the kernel allocated for the send map
 * (msg_zerocopy and io_uring_zc senders), so write() or sendfile() transfers arrive by read().
 */
#include "zc_internal.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#ifdef ZC_HAVE_TCP_ZEROCOPY_RECEIVE

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include <linux/tcp.h>

#define TS_OPTION_LEN 12 /* TCP timestamps option, padded */

typedef struct {
    unsigned char *map;   /* the window mmap()ed from the socket */
    size_t maplen;
    unsigned char *copy;  /* read() buffer for what cannot be mapped */
    int lowat;            /* current SO_RCVLOWAT */
    uint64_t mapped, copied;
} zrecv_t;

static int available(char *why, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(why, len, "cannot open a TCP socket to probe TCP_ZEROCOPY_RECEIVE: %s", strerror(errno));
        return 0;
    }
    struct tcp_zerocopy_receive zc;
    memset(&zc, 0, sizeof zc);
    socklen_t zl = sizeof zc;
    int rc = getsockopt(fd, IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE, &zc, &zl);
    int code = errno;
    close(fd);
    /* a kernel with the option answers on an unconnected socket; one without it does not know it */
    if (rc < 0 && (code == ENOPROTOOPT || code == EOPNOTSUPP)) {
        snprintf(why, len, "the kernel has no TCP_ZEROCOPY_RECEIVE (Linux 4.18 or later): %s", strerror(code));
        return 0;
    }
    return 1;
}

/* MTU of the interface holding the listening address; 0 when it cannot be told (a wildcard). */
static int listen_mtu(zc_ctx *c, int *family, char *ifname, size_t iflen)
{
    const char *host = c->p->host;
    if (!host || !*host)
        return 0;
    struct addrinfo hints, *res;
    memset(&hints, 0, sizeof hints);
    hints.ai_flags = AI_NUMERICHOST;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host, NULL, &hints, &res) != 0)
        return 0;
    *family = res->ai_family;
    struct ifaddrs *ifs = NULL;
    int mtu = 0;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && !mtu; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != res->ai_family)
                continue;
            int same = res->ai_family == AF_INET
                           ? memcmp(&((struct sockaddr_in *)i->ifa_addr)->sin_addr,
                                    &((struct sockaddr_in *)res->ai_addr)->sin_addr, sizeof(struct in_addr)) == 0
                           : memcmp(&((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr,
                                    &((struct sockaddr_in6 *)res->ai_addr)->sin6_addr, sizeof(struct in6_addr)) == 0;
            if (!same)
                continue;
            struct ifreq ifr;
            memset(&ifr, 0, sizeof ifr);
            snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", i->ifa_name);
            int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            if (s >= 0 && ioctl(s, SIOCGIFMTU, &ifr) == 0) {
                mtu = ifr.ifr_mtu;
                snprintf(ifname, iflen, "%s", i->ifa_name);
            }
            if (s >= 0)
                close(s);
        }
        freeifaddrs(ifs);
    }
    freeaddrinfo(res);
    return mtu;
}

static int setup(zc_ctx *c)
{
    zrecv_t *s = zc_priv_new(c, sizeof *s);
    if (!s)
        return -1;
    s->maplen = (c->buffer + c->page - 1) / c->page * c->page;
    s->copy = zc_alloc(c, c->buffer, "the copy buffer");
    if (!s->copy)
        return -1;
    if (c->p->tcp_maxseg > 0)
        return 0; /* the user's TCP_MAXSEG; the connection check below still applies */
    int family = AF_INET;
    char ifname[IF_NAMESIZE + 1] = "";
    int mtu = listen_mtu(c, &family, ifname, sizeof ifname);
    if (mtu <= 0)
        return 0; /* a wildcard address: nothing to size for (checked once connected) */
    int hdr = (family == AF_INET6 ? 40 : 20) + 20;
    int ts = zc_read_sysctl("/proc/sys/net/ipv4/tcp_timestamps", 1) ? TS_OPTION_LEN : 0;
    long payload = (long)mtu - hdr - ts;
    long pages = payload > 0 ? payload / (long)c->page : 0;
    if (pages < 1)
        return zc_fail(c, EOPNOTSUPP, "the data interface %s has MTU %d: a TCP segment carries at most %ld payload "
                                      "bytes, less than one %zu-byte page, so TCP_ZEROCOPY_RECEIVE could map nothing; "
                                      "raise its MTU to at least %ld",
                       ifname, mtu, payload, c->page, (long)c->page + hdr + ts);
    long most = (ZC_MAX_TCP_MAXSEG - ts) / (long)c->page; /* the kernel's TCP_MAXSEG limit */
    c->listen_maxseg = (int)((pages < most ? pages : most) * (long)c->page + ts);
    return 0;
}

static int connected(zc_ctx *c)
{
    zrecv_t *s = c->priv;
    /* a segment's payload: the MSS we advertised (less the timestamp option already), within the path MTU */
    struct tcp_info ti;
    socklen_t tl = sizeof ti;
    memset(&ti, 0, sizeof ti);
    if (getsockopt(c->sock, IPPROTO_TCP, TCP_INFO, &ti, &tl) == 0 && ti.tcpi_advmss && ti.tcpi_pmtu) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int v6 = getsockname(c->sock, (struct sockaddr *)&ss, &sl) == 0 && ss.ss_family == AF_INET6;
        long opts = (ti.tcpi_options & TCPI_OPT_TIMESTAMPS) ? TS_OPTION_LEN : 0;
        long route = (long)ti.tcpi_pmtu - (v6 ? 40 : 20) - 20 - opts;
        long payload = (long)ti.tcpi_advmss < route ? (long)ti.tcpi_advmss : route;
        if (payload < (long)c->page)
            return zc_fail(c, EOPNOTSUPP, "the connection carries %ld payload bytes per segment (advertised MSS %u, "
                                          "path MTU %u), "
                                          "less than one %zu-byte page, so TCP_ZEROCOPY_RECEIVE could map nothing; "
                                          "raise the MTU or --tcp-maxseg (payload + 12 bytes per segment)",
                           payload, ti.tcpi_advmss, ti.tcpi_pmtu, c->page);
    }
    s->map = mmap(NULL, s->maplen, PROT_READ, MAP_SHARED, c->sock, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        return zc_fail_errno(c, "mmap of %zu bytes of the TCP socket (tcp_mmap)", s->maplen);
    }
    s->lowat = (int)s->maplen;
    if (setsockopt(c->sock, SOL_SOCKET, SO_RCVLOWAT, &s->lowat, sizeof s->lowat) < 0)
        return zc_fail_errno(c, "setsockopt(SO_RCVLOWAT, %d)", s->lowat);
    return 0;
}

/* Wait (within the deadline) until a window's worth, the end of what is expected, or EOF is there. */
static int wait_readable(zc_ctx *c, zrecv_t *s, size_t want)
{
    int lowat = (int)(want < s->maplen ? want : s->maplen);
    if (lowat != s->lowat) {
        if (setsockopt(c->sock, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat) < 0)
            return zc_fail_errno(c, "setsockopt(SO_RCVLOWAT, %d)", lowat);
        s->lowat = lowat;
    }
    for (;;) {
        int n = zc_wait_fd(c, c->sock, POLLIN, "receiving");
        if (n != 0)
            return n < 0 ? -1 : 0;
    }
}

/* read() what cannot be mapped: at most n bytes; 0 at EOF */
static ssize_t copy_some(zc_ctx *c, zrecv_t *s, size_t n)
{
    ssize_t got = zc_sock_read(c, s->copy, zc_min(c->buffer, n));
    if (got > 0) {
        if (zc_file_write_all(c, s->copy, (size_t)got) < 0)
            return -1;
        c->done += (uint64_t)got;
        s->copied += (uint64_t)got;
    }
    return got;
}

static int transfer(zc_ctx *c)
{
    zrecv_t *s = c->priv;
    int rc = 0;
    for (;;) {
        if (zc_check_deadline(c, "receiving") < 0) {
            rc = -1;
            break;
        }
        size_t want = zc_recv_want(c, s->maplen);
        if (want == 0)
            break;
        if (wait_readable(c, s, want) < 0) {
            rc = -1;
            break;
        }
        struct tcp_zerocopy_receive zc;
        memset(&zc, 0, sizeof zc);
        zc.address = (uint64_t)(uintptr_t)s->map;
        zc.length = (uint32_t)(want / c->page * c->page);
        socklen_t zl = sizeof zc;
        if (zc.length == 0 || getsockopt(c->sock, IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE, &zc, &zl) < 0) {
            if (zc.length && errno != EIO) { /* EIO: nothing queued and the sender closed */
                rc = zc_fail_errno(c, "getsockopt(TCP_ZEROCOPY_RECEIVE)");
                break;
            }
            ssize_t got = copy_some(c, s, want); /* the tail below one page, or EOF */
            if (got < 0)
                rc = -1;
            if (got <= 0)
                break;
            continue;
        }
        if (zc.length) {
            rc = zc_file_write_all(c, s->map, zc.length);
            madvise(s->map, zc.length, MADV_DONTNEED);
            if (rc < 0)
                break;
            c->done += zc.length;
            s->mapped += zc.length;
        }
        if (zc.recv_skip_hint) {
            ssize_t got = copy_some(c, s, zc_min(zc.recv_skip_hint, want - zc.length));
            if (got < 0) {
                rc = -1;
                break;
            }
            if (got == 0)
                break;
        } else if (!zc.length) {
            /* readable but nothing mapped or hinted: EOF or an error; read() says which */
            ssize_t got = copy_some(c, s, want);
            if (got < 0)
                rc = -1;
            if (got <= 0)
                break;
        }
    }
    c->m.zc_recv_mapped = (int64_t)s->mapped;
    c->m.zc_recv_copied = (int64_t)s->copied;
    return rc;
}

static void teardown(zc_ctx *c)
{
    zrecv_t *s = c->priv;
    if (!s)
        return;
    if (s->map)
        munmap(s->map, s->maplen);
    zc_free(s->copy, c->buffer);
    zc_free(s, sizeof *s);
    c->priv = NULL;
}

const zc_mode_ops zc_recv_zerocopy_recv_ops = {
    .name = "zerocopy_recv",
    .side = ZC_SIDE_RECV,
    .caps = ZC_CAP_ZC_RECV | ZC_CAP_KERNEL_FEATURE,
    .available = available,
    .setup = setup,
    .connected = connected,
    .transfer = transfer,
    .teardown = teardown,
};

#else /* built without struct tcp_zerocopy_receive in <linux/tcp.h>: listed, never run */

ZC_UNBUILT_MODE(zc_recv_zerocopy_recv_ops, "zerocopy_recv", ZC_SIDE_RECV, ZC_CAP_ZC_RECV | ZC_CAP_KERNEL_FEATURE,
                "tcp_zerocopy_receive");

#endif
