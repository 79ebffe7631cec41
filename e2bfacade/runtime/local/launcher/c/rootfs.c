/* The guest's root file system, built by the sandbox's init in the sandbox's directory
 * before pivot_root: the image layers and the disk as an overlay, the read-only host binds,
 * /proc (lxcfs's files, an own boot_id, the host's secrets masked), /sys, /dev and /run;
 * then, in the new root, the volumes. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/openat2.h> /* struct open_how, RESOLVE_* */

#include "launcher.h"

static void mkdir_p_in(const char *path, mode_t mode) {
    if (mkdir(path, mode) != 0 && errno != EEXIST) fail("mkdir", "%s: %s", path, strerror(errno));
}

/* The guest owns its tree: a mount point it replaced with a symlink (a snapshot whose /tmp
 * links to /etc/shadow) must never be followed on the host before pivot_root. */
static void require_dir_or_absent(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf;; p++) {
        if (*p == '/' || *p == 0) {
            char saved = *p;
            *p = 0;
            struct stat st;
            if (lstat(buf, &st) == 0 && !S_ISDIR(st.st_mode))
                fail("mountpoint", "/%s is not a directory", buf);
            *p = saved;
            if (saved == 0) break;
        }
    }
}

static void mount_or_fail(const char *src, const char *dst, const char *type, unsigned long flags,
                          const char *data) {
    if (mount(src, dst, type, flags, data) != 0)
        fail("mount", "%s on %s (%s): %s", src ? src : "none", dst, type ? type : "bind",
             strerror(errno));
}

static void bind_readonly(const char *src, const char *dst, unsigned long extra) {
    mount_or_fail(src, dst, NULL, MS_BIND | MS_REC, NULL);
    mount_or_fail(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | extra, NULL);
}

/* What a guest must not read of the host kernel: Docker's masked paths, plus what leaks the
 * host's keys, memory layout, boot line, build and disks. A file is covered by /dev/null,
 * a directory by an empty read-only tmpfs; what this kernel lacks is skipped. */
static const char *masked_paths[] = {
    "proc/acpi", "proc/asound", "proc/kcore", "proc/keys", "proc/key-users",
    "proc/latency_stats", "proc/timer_list", "proc/timer_stats", "proc/sched_debug",
    "proc/scsi", "proc/slabinfo", "proc/vmallocinfo", "proc/config.gz", "proc/cmdline",
    "proc/kallsyms", "proc/modules", "proc/partitions", "proc/diskstats", "proc/mtrr",
    "proc/iomem", "proc/ioports", "proc/kpagecount", "proc/kpageflags", "proc/kpagecgroup",
    "proc/pagetypeinfo", "proc/zoneinfo", "proc/buddyinfo", "proc/swaps", "proc/mounts_host",
    "sys/firmware", "sys/devices/virtual/powercap", "sys/kernel/vmcoreinfo",
    "sys/kernel/debug", "sys/kernel/tracing", "sys/kernel/security", "sys/block",
    "sys/class/block", "sys/dev/block", "sys/fs/cgroup", "sys/module",
};

static void mask_path(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        mount_or_fail("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                      "size=0,mode=555");
    } else {
        mount_or_fail("/dev/null", path, NULL, MS_BIND, NULL);
        mount_or_fail(NULL, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID, NULL);
    }
}

static void attach(int mount_fd, const char *dst) {
    if (syscall(SYS_move_mount, mount_fd, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) != 0)
        fail("mount", "attach %s: %s", dst, strerror(errno));
    close(mount_fd);
}

static void bind_dev(const char *name) {
    char src[64], dst[64];
    snprintf(src, sizeof src, "/dev/%s", name);
    snprintf(dst, sizeof dst, "dev/%s", name);
    int fd = open(dst, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0666);
    if (fd < 0) fail("dev", "%s: %s", dst, strerror(errno));
    close(fd);
    mount_or_fail(src, dst, NULL, MS_BIND, NULL);
}

/* The machine-wide /proc files of the sandbox's own (lxcfs.py says which and why), bound
 * read-only from lxcfs over the kernel's. */
static void bind_lxcfs(int mount_fd) {
    static const char *files[] = {"meminfo", "cpuinfo", "stat", "uptime", "loadavg", "swaps"};
    if (mkdir("../stage/lxcfs", 0700) != 0) fail("lxcfs", "stage: %s", strerror(errno));
    attach(mount_fd, "../stage/lxcfs");
    char src[64], dst[64];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(src, sizeof src, "../stage/lxcfs/proc/%s", files[i]);
        snprintf(dst, sizeof dst, "proc/%s", files[i]);
        bind_readonly(src, dst, MS_NOSUID | MS_NODEV | MS_NOEXEC);
    }
}

/* The guest's boot_id is its own, new at every launch of its init (a cold boot on the same
 * disk too), as a VM's is at every boot; the host's is not the guest's to see. The kernel's
 * uuid generator makes it; it lives in the stage tmpfs (memory of the init's, gone with it),
 * bound read-only over the proc file. (lxcfs has no boot_id: LXC binds a file like this.) */
static int own_boot_id(void) {
    char id[40];
    int fd = open("proc/sys/kernel/random/uuid", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, id, sizeof id);
    close(fd);
    if (n != 37) return n < 0 ? -1 : (errno = EIO, -1);
    fd = open("../stage/boot_id", O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0444);
    if (fd < 0) return -1;
    ssize_t w = write(fd, id, (size_t)n);
    close(fd);
    return w == n ? 0 : (errno = EIO, -1);
}

/* The layers as one overlay, the guest's root, which becomes the working directory: its
 * lower layers the image's (FDS[0..NLOWER)), its upper one the sandbox's disk. */
static void mount_overlay_root(const int *fds, int nlower, int nbinds) {
    /* Nothing we mount may propagate back to the host. */
    mount_or_fail(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* Mount points for the layers, in memory: nothing to make or clean up on the disk. */
    mount_or_fail("tmpfs", "stage", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=700");
    char opts[REQ_MAX], stage[64];
    for (int i = 0; i < nlower; i++) {
        snprintf(stage, sizeof stage, "stage/l%d", i);
        if (mkdir(stage, 0700) != 0) fail("stage", "%s: %s", stage, strerror(errno));
    }
    for (int i = 0; i < nbinds; i++) {
        snprintf(stage, sizeof stage, "stage/b%d", i);
        if (mkdir(stage, 0700) != 0) fail("stage", "%s: %s", stage, strerror(errno));
    }
    if (mkdir("stage/empty", 0700) != 0) fail("stage", "empty: %s", strerror(errno));
    size_t off = (size_t)snprintf(opts, sizeof opts, "lowerdir=");
    for (int i = 0; i < nlower; i++) {
        snprintf(stage, sizeof stage, "stage/l%d", i);
        attach(fds[i], stage);
        off += (size_t)snprintf(opts + off, sizeof opts - off, "%s%s", i ? ":" : "", stage);
    }
    /* userxattr: overlay's own metadata (opaque directories) as user.overlay.* xattrs, the
     * ones an unprivileged mounter may use. nodev: a device node in a layer is never a way
     * around the missing CAP_MKNOD. */
    snprintf(opts + off, sizeof opts - off,
             ",upperdir=disk/upper,workdir=disk/work,userxattr,redirect_dir=nofollow,index=off,metacopy=off");
    /* The source is what the guest's mountinfo and df show: a plain name, never a host
     * path. (The host tells a sandbox's mounts apart by its disk, mounted at its directory.) */
    mount_or_fail("overlay", "rootfs", "overlay", MS_NODEV, opts);
    if (chdir("rootfs") != 0) fail("chdir", "rootfs: %s", strerror(errno));
}

/* The host binds (R->binds, their mounts FDS[0..nbinds)), each at its guest path. */
static void mount_binds(const struct create_req *r, const int *fds) {
    for (int i = 0; i < r->nbinds; i++) {
        char spec[4096];
        snprintf(spec, sizeof spec, "%s", r->binds[i]);
        char *colon = strchr(spec, ':');
        if (!colon) fail("bind", "malformed bind %s", spec);
        const char *dst = colon + 1;
        while (*dst == '/') dst++;
        require_dir_or_absent(dst);
        mkdir_p_in(dst, 0755);
        /* A host directory (/usr) as a lower-only overlay of its idmapped copy: read-only
         * in the superblock itself, so no remount can ever make the host's files writable. */
        char bstage[64], bopts[256];
        snprintf(bstage, sizeof bstage, "../stage/b%d", i);
        attach(fds[i], bstage);
        snprintf(bopts, sizeof bopts, "lowerdir=%s:../stage/empty,userxattr,redirect_dir=nofollow",
                 bstage);
        mount_or_fail("overlay", dst, "overlay", MS_RDONLY | MS_NODEV, bopts);
    }
}

static void make_mount_points(void) {
    const char *dirs[] = {"proc", "sys", "dev", "tmp", "run"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        require_dir_or_absent(dirs[i]);
        mkdir_p_in(dirs[i], 0755);
    }
    int tmpfd = open("tmp", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tmpfd < 0 || fchmod(tmpfd, 01777) != 0) fail("chmod", "/tmp: %s", strerror(errno));
    close(tmpfd);
}

/* /proc (its knobs read-only, its own boot_id, lxcfs's files when LXCFS_FD >= 0) and /sys,
 * with the host's secrets masked. */
static void mount_proc_sys(int lxcfs_fd) {
    mount_or_fail("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    /* Global kernel knobs stay read-only (a writable core_pattern is a classic escape). */
    const char *ro_proc[] = {"proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus", "proc/fs"};
    for (size_t i = 0; i < sizeof ro_proc / sizeof ro_proc[0]; i++)
        if (access(ro_proc[i], F_OK) == 0) bind_readonly(ro_proc[i], ro_proc[i], MS_NOSUID);
    if (own_boot_id() != 0) fail("boot_id", "%s", strerror(errno));
    bind_readonly("../stage/boot_id", "proc/sys/kernel/random/boot_id",
                  MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (lxcfs_fd >= 0) bind_lxcfs(lxcfs_fd);
    mount_or_fail("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    for (size_t i = 0; i < sizeof masked_paths / sizeof masked_paths[0]; i++)
        mask_path(masked_paths[i]);
}

/* /dev: a tmpfs with the host's harmless device nodes, ptys of its own, /dev/shm; and /run. */
static void mount_dev(void) {
    mount_or_fail("tmpfs", "dev", "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=65536k");
    /* mknod is refused in a user namespace: the host's own device nodes, bound in. */
    const char *devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
    for (size_t i = 0; i < sizeof devs / sizeof devs[0]; i++) bind_dev(devs[i]);
    mkdir_p_in("dev/pts", 0755);
    mkdir_p_in("dev/shm", 01777);
    mount_or_fail("devpts", "dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                  "newinstance,ptmxmode=0666,mode=0620");
    mount_or_fail("tmpfs", "dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=65536k");
    if (symlink("pts/ptmx", "dev/ptmx") || symlink("/proc/self/fd", "dev/fd") ||
        symlink("/proc/self/fd/0", "dev/stdin") || symlink("/proc/self/fd/1", "dev/stdout") ||
        symlink("/proc/self/fd/2", "dev/stderr"))
        fail("symlink", "/dev: %s", strerror(errno));
    mount_or_fail("tmpfs", "run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=65536k");
}

void build_rootfs(const struct create_req *r, const int *fds, int nlower) {
    mount_overlay_root(fds, nlower, r->nbinds);
    mount_binds(r, fds + nlower);
    make_mount_points();
    mount_proc_sys(r->lxcfs ? fds[nlower + r->nbinds] : -1);
    mount_dev();
    /* pivot_root(".", ".") stacks the old root under the new one; detaching it leaves the
     * guest with no path back to the host's file system. */
    if (syscall(SYS_pivot_root, ".", ".") != 0) fail("pivot_root", "%s", strerror(errno));
    if (umount2(".", MNT_DETACH) != 0) fail("umount old root", "%s", strerror(errno));
    if (chdir("/") != 0) fail("chdir", "/: %s", strerror(errno));
}

/* PATH (relative) opened as a directory, resolved inside the guest's root ROOT: a symlink
 * or ".." never leaves it, and no /proc magic link is followed. */
static int open_in_root(int root, const char *path) {
    struct open_how how = {.flags = O_PATH | O_DIRECTORY | O_CLOEXEC,
                           .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    return (int)syscall(SYS_openat2, root, path, &how, sizeof how);
}

/* The guest path DST (absolute) as a directory, made where missing (0755, guest root's),
 * every component resolved inside the guest's root. Returns an O_PATH descriptor of it. */
static int make_dir_in_root(int root, const char *dst) {
    char buf[4096];
    while (*dst == '/') dst++;
    if (!*dst || strlen(dst) >= sizeof buf) fail("volume", "bad mount path /%s", dst);
    snprintf(buf, sizeof buf, "%s", dst);
    for (char *p = buf;; p++) {
        if (*p != '/' && *p != 0) continue;
        char saved = *p;
        *p = 0;
        int fd = open_in_root(root, buf);
        if (fd < 0 && errno == ENOENT) {
            char *slash = strrchr(buf, '/');
            int parent = root;
            const char *name = buf;
            if (slash) {
                *slash = 0;
                parent = open_in_root(root, buf);
                *slash = '/';
                name = slash + 1;
            }
            if (parent < 0) fail("volume", "/%s: %s", buf, strerror(errno));
            if (mkdirat(parent, name, 0755) != 0 && errno != EEXIST)
                fail("volume", "mkdir /%s: %s", buf, strerror(errno));
            if (parent != root) close(parent);
            fd = open_in_root(root, buf);
        }
        if (fd < 0) fail("volume", "/%s: %s", buf, strerror(errno));
        if (saved == 0) return fd;
        close(fd);
        *p = saved;
    }
}

/* After pivot_root: the guest path comes from the user and the image is the user's, so
 * each mount point is made and resolved in the guest's root, where no path leads to the
 * host's files. */
void mount_volumes(const struct create_req *r, const int *fds) {
    if (r->nvolumes == 0) return;
    int root = open("/", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0) fail("volume", "/: %s", strerror(errno));
    for (int i = 0; i < r->nvolumes; i++) {
        const char *colon = strchr(r->volumes[i], ':');
        if (!colon) fail("volume", "malformed volume %s", r->volumes[i]);
        int target = make_dir_in_root(root, colon + 1);
        if (syscall(SYS_move_mount, fds[i], "", target, "",
                    MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
            fail("volume", "mount at %s: %s", colon + 1, strerror(errno));
        close(target);
        close(fds[i]);
    }
    close(root);
}
