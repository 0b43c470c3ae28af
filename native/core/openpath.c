/* Opening a source or a sink once, without following a link in any component, judged on what was opened.
 * A check of the name then an open of the name leaves a window (a parent swapped for a link to /proc/sys or
 * /dev turns a sink into a kernel setting), so nothing looks at a path before opening it:
 *   1. the parent directory: openat2() O_PATH with RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS (without
 *      openat2, ENOSYS: one component at a time, openat O_NOFOLLOW | O_DIRECTORY);
 *   2. the last component beneath it, O_NOFOLLOW and first O_PATH (opening a device can act: a tape rewinds),
 *      judged by fstat (a regular file, or a device allowed by number) and fstatfs (data_fs below);
 *   3. only then opened for I/O from the same directory descriptor, and checked to be the inode judged.
 * A missing sink is created (O_EXCL) in the judged directory; nothing is truncated here. zc_open_dir gives
 * step 1's descriptor, judged on its filesystem, to a caller creating files beneath it (the worker's `layout`).
 */
#include "zc_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#if defined(__has_include)
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#define ZC_HAVE_OPENAT2_H 1
#endif
#endif
#ifndef ZC_HAVE_OPENAT2_H
struct open_how {
    uint64_t flags;
    uint64_t mode;
    uint64_t resolve;
};
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_NO_SYMLINKS 0x04
#endif
#ifndef SYS_openat2
#define SYS_openat2 437 /* the same on every architecture (the unified numbers of new system calls) */
#endif

/* Filesystems that hold data (statfs f_type): a regular-file source or sink must be on one of them; anything
 * else is refused, named by `kernel_fs` when it is a kernel interface. (devtmpfs reports tmpfs's number.) */
static const struct fs_kind {
    unsigned long magic;
    const char *name;
} data_fs[] = {
    {0xEF53, "ext2/ext3/ext4"}, {0x58465342, "xfs"}, {0x9123683E, "btrfs"}, {0x01021994, "tmpfs"},
    {0x858458f6, "ramfs"}, {0x794c7630, "overlay"}, {0xF2F52010, "f2fs"}, {0xca451a4e, "bcachefs"},
    {0x2fc12fc1, "zfs"}, {0x3153464a, "jfs"}, {0x52654973, "reiserfs"}, {0x3434, "nilfs2"},
    {0x4d44, "vfat"}, {0x2011BAB0, "exfat"}, {0x5346544e, "ntfs"}, {0x7366746e, "ntfs3"},
    {0x6969, "nfs"}, {0xFF534D42, "cifs"}, {0xFE534D42, "smb2"}, {0x00c36400, "ceph"},
    {0x01161970, "gfs2"}, {0x7461636f, "ocfs2"}, {0x0BD00BD0, "lustre"}, {0x65735546, "fuse"},
    {0x01021997, "9p"}, {0x73717368, "squashfs"}, {0xE0F5E1E2, "erofs"}, {0x9660, "iso9660"},
    {0x15013346, "udf"},
};
/* Names only, for the message: the kernel interfaces a path is most often found to be on. */
static const struct fs_kind kernel_fs[] = {
    {0x9fa0, "proc"}, {0x62656572, "sysfs"}, {0x64626720, "debugfs"}, {0x74726163, "tracefs"},
    {0x73636673, "securityfs"}, {0x27e0eb, "cgroup"}, {0x63677270, "cgroup2"}, {0xcafe4a11, "bpf"},
    {0x6165676C, "pstore"}, {0xde5e81e4, "efivarfs"}, {0x62656570, "configfs"}, {0x1cd1, "devpts"},
    {0x958458f6, "hugetlbfs"}, {0x19800202, "mqueue"}, {0x6e736673, "nsfs"}, {0x42494e4d, "binfmt_misc"},
    {0xf97cff8c, "selinuxfs"}, {0x43415d53, "smackfs"}, {0x0187, "autofs"}, {0x65735543, "fusectl"},
};

static const char *fs_name(const struct fs_kind *t, size_t n, unsigned long magic)
{
    for (size_t i = 0; i < n; i++)
        if (t[i].magic == magic)
            return t[i].name;
    return NULL;
}

static int failf(zc_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int failf(zc_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    err->code = code;
    return -1;
}

static const char *what_of(int how)
{
    return (how & 3) == ZC_OPEN_SINK ? "sink" : "source";
}

/* An O_PATH descriptor of directory `dir` reached without following any link; -1 with errno. */
static int open_dir_walk(const char *dir)
{
    int cur = open(dir[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (cur < 0)
        return -1;
    char comp[256];
    const char *s = dir;
    while (*s) {
        while (*s == '/')
            s++;
        const char *e = s;
        while (*e && *e != '/')
            e++;
        size_t n = (size_t)(e - s);
        if (n == 0)
            break;
        if (n >= sizeof comp) {
            close(cur);
            errno = ENAMETOOLONG;
            return -1;
        }
        memcpy(comp, s, n);
        comp[n] = '\0';
        s = e;
        if (strcmp(comp, ".") == 0)
            continue;
        int next = openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            int saved = errno;
            struct stat st;
            if ((saved == ENOTDIR || saved == ELOOP) && fstatat(cur, comp, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISLNK(st.st_mode))
                saved = ELOOP;
            close(cur);
            errno = saved;
            return -1;
        }
        close(cur);
        cur = next;
    }
    return cur;
}

static int open_dir(const char *dir, int walk)
{
    if (!walk) {
        struct open_how how;
        memset(&how, 0, sizeof how);
        how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
        how.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
        for (int tries = 0; tries < 8; tries++) {
            long fd = syscall(SYS_openat2, AT_FDCWD, dir, &how, sizeof how);
            if (fd >= 0)
                return (int)fd;
            if (errno == EAGAIN || errno == EINTR) /* a concurrent rename during the lookup: look again */
                continue;
            if (errno != ENOSYS)
                return -1;
            break;
        }
    }
    return open_dir_walk(dir);
}

static int allowed_device(const struct stat *st, int how)
{
    if (how & ZC_OPEN_DEVICES)
        return 1;
    if (!S_ISCHR(st->st_mode))
        return 0;
    unsigned ma = major(st->st_rdev), mi = minor(st->st_rdev);
    if (ma != 1)
        return 0;
    if ((how & 3) == ZC_OPEN_SINK)
        return mi == 3;                           /* /dev/null */
    return mi == 3 || mi == 5 || mi == 9;     /* /dev/null, /dev/zero, /dev/urandom */
}

static const char *devices_text(int how)
{
    return (how & 3) == ZC_OPEN_SINK ? "/dev/null" : "/dev/null, /dev/zero, /dev/urandom";
}

static int open_error(zc_error *err, const char *path, int how, int code)
{
    const char *what = what_of(how);
    if (code == ELOOP)
        return failf(err, ELOOP, "%s %s: a component of the path is a symbolic link: refused (the worker follows "
                     "no link: name the real path)", what, path);
    if (code == ENOENT && (how & 3) == ZC_OPEN_SOURCE)
        return failf(err, ENOENT, "cannot open source %s: %s", path, strerror(code));
    return failf(err, code, "cannot open %s %s: %s", what, path, strerror(code));
}

/* The verdict on descriptor fd (O_PATH or open): 0, or -1 with err filled. */
static int judge(int fd, const char *path, int how, struct stat *st, zc_error *err)
{
    const char *what = what_of(how);
    if (fstat(fd, st) < 0)
        return failf(err, errno, "%s %s: fstat: %s", what, path, strerror(errno));
    if (S_ISDIR(st->st_mode))
        return failf(err, EISDIR, "%s %s is a directory", what, path);
    if (S_ISLNK(st->st_mode)) /* the last component, opened O_PATH | O_NOFOLLOW: the link itself */
        return open_error(err, path, how, ELOOP);
    if (S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode)) {
        if (allowed_device(st, how))
            return 0;
        const char *kind = S_ISBLK(st->st_mode) ? "block" : "character";
        if ((how & 3) == ZC_OPEN_SINK)
            return failf(err, EPERM, "sink %s is a %s device (%u:%u), not /dev/null: refused (the experiment must "
                         "list it in `allow_destroy:`; the worker needs --allow-device-sink)", path, kind,
                         major(st->st_rdev), minor(st->st_rdev));
        return failf(err, EPERM, "source %s is a %s device (%u:%u), not one of %s: refused", path, kind,
                     major(st->st_rdev), minor(st->st_rdev), devices_text(how));
    }
    /* A FIFO the user made is a source like a file (reading it changes nothing; the open waits for its writer,
     * as it always did); as a sink it would feed whatever program reads it: refused. */
    int fifo_source = S_ISFIFO(st->st_mode) && (how & 3) != ZC_OPEN_SINK;
    if (!S_ISREG(st->st_mode) && !fifo_source)
        return failf(err, EPERM, "%s %s is neither a regular file nor one of the devices %s%s: refused", what, path,
                     devices_text(how), (how & 3) == ZC_OPEN_SINK ? "" : " (nor a FIFO)");
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0)
        return failf(err, errno, "%s %s: fstatfs: %s", what, path, strerror(errno));
    unsigned long magic = (unsigned long)(unsigned int)sf.f_type;
    if (fs_name(data_fs, NELEM(data_fs), magic))
        return 0;
    const char *kname = fs_name(kernel_fs, NELEM(kernel_fs), magic);
    return failf(err, EPERM, "%s %s is on %s%s (filesystem type 0x%lx), not on a data filesystem the worker "
                 "reads or writes (ext2/3/4, xfs, btrfs, tmpfs, overlay, nfs...: docs/architecture.md): refused%s",
                 what, path, kname ? kname : "an unknown filesystem", kname ? ", a kernel interface" : "", magic,
                 kname && (how & 3) == ZC_OPEN_SINK ? " (network settings belong in `networks:`, which restores them)"
                                                      : "");
}

int zc_open_path(const char *path, int how, struct stat *st, int *created, zc_error *err)
{
    const char *what = what_of(how);
    err->code = 0;
    err->message[0] = '\0';
    if (created)
        *created = 0;
    size_t len = path ? strlen(path) : 0;
    if (len == 0 || path[len - 1] == '/')
        return failf(err, EINVAL, "%s %s: not a path of a file", what, path ? path : "(none)");
    if (len >= 4096)
        return failf(err, ENAMETOOLONG, "%s: a path of %zu bytes", what, len);
    char dir[4096];
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    if (!slash)
        strcpy(dir, ".");
    else if (slash == path)
        strcpy(dir, "/");
    else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = '\0';
    }
    if (strcmp(base, ".") == 0 || strcmp(base, "..") == 0)
        return failf(err, EISDIR, "%s %s is a directory", what, path);
    int dfd = open_dir(dir, how & ZC_OPEN_WALK);
    if (dfd < 0)
        return open_error(err, path, how, errno);
    int sink = (how & 3) == ZC_OPEN_SINK;
    int rw = sink ? O_RDWR : O_RDONLY;
    int fd = -1, rc = -1;
    struct stat seen;
    int pfd = openat(dfd, base, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    if (pfd < 0 && errno == ENOENT && sink && (how & ZC_OPEN_CREATE)) {
        struct statfs sf;   /* create only in a directory on a data filesystem */
        if (fstatfs(dfd, &sf) < 0) {
            failf(err, errno, "sink %s: fstatfs of its directory: %s", path, strerror(errno));
            goto out;
        }
        unsigned long magic = (unsigned long)(unsigned int)sf.f_type;
        if (!fs_name(data_fs, NELEM(data_fs), magic)) {
            const char *kname = fs_name(kernel_fs, NELEM(kernel_fs), magic);
            failf(err, EPERM, "sink %s: its directory is on %s (filesystem type 0x%lx), not on a data filesystem: "
                  "refused", path, kname ? kname : "an unknown filesystem", magic);
            goto out;
        }
        fd = openat(dfd, base, rw | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0644);
        if (fd < 0) {
            open_error(err, path, how, errno);
            goto out;
        }
        if (created)
            *created = 1;
        rc = judge(fd, path, how, st, err);
        goto out;
    }
    if (pfd < 0) {
        open_error(err, path, how, errno);
        goto out;
    }
    if (judge(pfd, path, how, &seen, err) < 0)
        goto out;
    fd = openat(dfd, base, rw | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        open_error(err, path, how, errno);
        goto out;
    }
    if (judge(fd, path, how, st, err) < 0)
        goto out;
    if (st->st_dev != seen.st_dev || st->st_ino != seen.st_ino) {
        failf(err, EAGAIN, "%s %s was replaced while it was being opened: refused", what, path);
        goto out;
    }
    rc = 0;
out:
    if (pfd >= 0)
        close(pfd);
    close(dfd);
    if (rc < 0 && fd >= 0) {
        close(fd);
        fd = -1;
    }
    return rc < 0 ? -1 : fd;
}

int zc_open_dir(const char *path, int how, zc_error *err)
{
    err->code = 0;
    err->message[0] = '\0';
    size_t len = path ? strlen(path) : 0;
    if (len == 0 || path[0] != '/')
        return failf(err, EINVAL, "directory %s: not an absolute path", path ? path : "(none)");
    if (len >= 4096)
        return failf(err, ENAMETOOLONG, "directory: a path of %zu bytes", len);
    int dfd = open_dir(path, how & ZC_OPEN_WALK);
    if (dfd < 0) {
        int code = errno;
        if (code == ELOOP)
            return failf(err, ELOOP, "directory %s: a component of the path is a symbolic link: refused (the worker "
                         "follows no link: name the real path)", path);
        if (code == ENOENT)
            return failf(err, ENOENT, "directory %s does not exist", path);
        if (code == ENOTDIR)
            return failf(err, ENOTDIR, "directory %s: a component of the path is not a directory", path);
        return failf(err, code, "cannot open directory %s: %s", path, strerror(code));
    }
    struct statfs sf;
    if (fstatfs(dfd, &sf) < 0) {
        int code = errno;
        close(dfd);
        return failf(err, code, "directory %s: fstatfs: %s", path, strerror(code));
    }
    unsigned long magic = (unsigned long)(unsigned int)sf.f_type;
    if (!fs_name(data_fs, NELEM(data_fs), magic)) {
        const char *kname = fs_name(kernel_fs, NELEM(kernel_fs), magic);
        close(dfd);
        return failf(err, EPERM, "directory %s is on %s%s (filesystem type 0x%lx), not on a data filesystem the "
                     "worker writes (ext2/3/4, xfs, btrfs, tmpfs, overlay, nfs...: docs/architecture.md): refused",
                     path, kname ? kname : "an unknown filesystem", kname ? ", a kernel interface" : "", magic);
    }
    return dfd;
}

int zc_open_file(const char *path, int how, int *created, zc_error *err)
{
    struct stat st;
    return zc_open_path(path, how, &st, created, err);
}
