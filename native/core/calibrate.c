/* Copy-cost calibration of a host (zc_calibrate, zcorch_api.h): the yardsticks CPU-per-byte figures are read
 * against. memcpy in 64 KiB calls (about one send/recv call's copy) of buffers larger than the caches, both
 * touched first, for 0.25 s and at least 5 rounds; first-touch page faults with transparent huge pages off,
 * 3 rounds; syscall(SYS_getppid) (never a libc cache), 3 rounds of 200000. Medians.
 */
#include "zc_internal.h"

#include <errno.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define COPY_CHUNK (64 * 1024)
#define MEMCPY_MIN_ROUNDS 5
#define MEMCPY_MAX_ROUNDS 200
#define MEMCPY_MIN_NS (250 * 1000 * 1000LL)
#define FAULT_ROUNDS 3
#define SYSCALL_ROUNDS 3
#define SYSCALL_CALLS 200000

static int fail(zc_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(zc_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = snprintf(err->message, sizeof err->message, "calibrate: ");
    vsnprintf(err->message + n, sizeof err->message - (size_t)n, fmt, ap);
    va_end(ap);
    err->code = code;
    return -1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static int64_t median(int64_t *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_i64);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void *map(size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int calibrate_memcpy(uint64_t bytes, zc_calibration *out, zc_error *err)
{
    size_t len = (size_t)bytes;
    unsigned char *src = map(len), *dst = map(len);
    if (!src || !dst) {
        int code = errno;
        if (src)
            munmap(src, len);
        if (dst)
            munmap(dst, len);
        return fail(err, code, "mmap of the memcpy buffers: %s", strerror(code));
    }
    memset(src, 0x5a, len); /* both touched: no page fault inside the timing */
    memset(dst, 0, len);
    int64_t rounds[MEMCPY_MAX_ROUNDS];
    int n = 0;
    int64_t start = zc_now_ns();
    while (n < MEMCPY_MAX_ROUNDS && (n < MEMCPY_MIN_ROUNDS || zc_now_ns() - start < MEMCPY_MIN_NS)) {
        int64_t t0 = zc_now_ns();
        for (size_t off = 0; off < len; off += COPY_CHUNK) {
            size_t k = len - off < COPY_CHUNK ? len - off : COPY_CHUNK;
            memcpy(dst + off, src + off, k);
            __asm__ volatile("" : : "r"(dst) : "memory"); /* every copy happens */
        }
        rounds[n++] = zc_now_ns() - t0;
    }
    munmap(src, len);
    munmap(dst, len);
    out->memcpy_bytes = bytes;
    out->memcpy_rounds = n;
    out->memcpy_ns = median(rounds, n); /* sorts them */
    out->memcpy_best_ns = rounds[0];
    return 0;
}

static int calibrate_faults(uint64_t bytes, zc_calibration *out, zc_error *err)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t len = (size_t)bytes / page * page;
    int64_t times[FAULT_ROUNDS], faults[FAULT_ROUNDS];
    for (int r = 0; r < FAULT_ROUNDS; r++) {
        volatile unsigned char *p = map(len);
        if (!p)
            return fail(err, errno, "mmap of the page-fault region: %s", strerror(errno));
#ifdef MADV_NOHUGEPAGE
        madvise((void *)p, len, MADV_NOHUGEPAGE); /* 4 KiB faults, not one 2 MiB fault per 512 pages */
#endif
        struct rusage r0, r1;
        getrusage(RUSAGE_THREAD, &r0);
        int64_t t0 = zc_now_ns();
        for (size_t off = 0; off < len; off += page)
            p[off] = 1;
        times[r] = zc_now_ns() - t0;
        getrusage(RUSAGE_THREAD, &r1);
        faults[r] = r1.ru_minflt - r0.ru_minflt;
        munmap((void *)p, len);
    }
    /* the round whose time is the median, with its own fault count */
    int64_t sorted[FAULT_ROUNDS];
    memcpy(sorted, times, sizeof times);
    int64_t med = median(sorted, FAULT_ROUNDS);
    int at = 0;
    for (int r = 0; r < FAULT_ROUNDS; r++)
        if (times[r] == med)
            at = r;
    out->page_size = (int64_t)page;
    out->fault_pages = len / page;
    out->fault_ns = med;
    out->fault_minflt = faults[at];
    return 0;
}

static void calibrate_syscall(zc_calibration *out)
{
    int64_t times[SYSCALL_ROUNDS];
    for (int r = 0; r < SYSCALL_ROUNDS; r++) {
        int64_t t0 = zc_now_ns();
        for (int i = 0; i < SYSCALL_CALLS; i++)
            syscall(SYS_getppid);
        times[r] = zc_now_ns() - t0;
    }
    out->syscall_calls = SYSCALL_CALLS;
    out->syscall_ns = median(times, SYSCALL_ROUNDS);
}

int zc_calibrate(uint64_t bytes, int cpu, zc_calibration *out, zc_error *err)
{
    memset(out, 0, sizeof *out);
    err->code = 0;
    err->message[0] = '\0';
    if (bytes < (1u << 20) || bytes > (1ULL << 34))
        return fail(err, EINVAL, "--bytes must be between 1MiB and 16GiB, got %llu", (unsigned long long)bytes);
    if (cpu >= CPU_SETSIZE)
        return fail(err, EINVAL, "--cpu %d is out of range", cpu);
    /* pinned while it measures, then the caller's CPUs back: in a long-lived process (a notebook, the test
     * suite) the thread, and every process it starts later, would otherwise stay on that one CPU */
    cpu_set_t before;
    if (cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(cpu, &set);
        if (sched_getaffinity(0, sizeof before, &before) < 0 || sched_setaffinity(0, sizeof set, &set) < 0)
            return fail(err, errno, "sched_setaffinity: %s", strerror(errno));
    }
    int rc = calibrate_memcpy(bytes, out, err) < 0 || calibrate_faults(bytes, out, err) < 0 ? -1 : 0;
    if (rc == 0)
        calibrate_syscall(out);
    if (cpu >= 0)
        sched_setaffinity(0, sizeof before, &before);
    return rc;
}
