/*
 * sandboxd: the privileged helper of e2bfacade's local runtime.
 *
 * Two modes, one static binary with agent.c (built by e2bfacade/runtime/local/build.py):
 *
 *   sandboxd daemon SOCKET
 *       A long-lived launcher and child subreaper. Each connection carries one "create"
 *       request; the daemon forks a handler for it, so a slow request never blocks another.
 *       The handler enters new mount/uts/ipc/net/pid namespaces and forks the sandbox's
 *       PID 1, which sets up the root file system and then stays in this same program as
 *       the sandbox's reaping init (no exec, so nothing of ours is mounted into the guest).
 *       When the handler exits, the init is re-parented to the daemon (PR_SET_CHILD_SUBREAPER),
 *       which reaps it when the sandbox dies. Without a subreaper a killed sandbox would stay
 *       a zombie wherever the host's PID 1 does not reap (it does not, on some VMs).
 *
 *   sandboxd seccomp-compile POLICY OUT
 *       Compiles the guests' seccomp policy (seccomp.py writes it) with libseccomp.
 *
 * Each sandbox's init also forks the guest agent (agent.c), which runs the guest's
 * commands; the host reaches it on the socket the init binds in the sandbox's directory.
 *
 * Create requests are NUL-separated "key=value" strings ended by an empty string:
 *   rootfs=DIR lower=A:B hostname=NAME cgroup=PROCS_FILE (repeatable)
 *   (the writable layer is disk/upper, with disk/work, in the sandbox's directory DIR)
 *   bind=SRC:DST (read-only host bind, repeatable)
 *   lxcfs=DIR (the runtime's lxcfs mount: the guest's meminfo, uptime... of its own)
 *   leave=PROCS_FILE (repeatable: where the handler moves itself once the init runs)
 *   cgroupdir=DIR (cgroup v2: the sandbox's group, which the sandbox is created in with
 *   clone3's CLONE_INTO_CGROUP, so that nothing migrates: instead of cgroup/leave items)
 * The reply is one line: "OK <host pid of init>" or "ERR <step>: <reason>".
 *
 * A request "park=PATH cgroup=PROCS_FILE..." makes a spare launcher instead (see park()):
 * it joins the groups, answers "OK parked <pid>", and serves one create request (without
 * cgroup or leave items) sent later to the socket PATH; it answers that one
 * "OK <init pid> <its own pid>" and exits when the caller closes the connection.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/sched.h> /* struct clone_args, CLONE_INTO_CGROUP */
#include <linux/keyctl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>

#include "sandboxd.h"

#define MAX_ITEMS 64
#define REQ_MAX 65536

static char **g_argv;
static size_t g_argv_len;

/* Capabilities the guest keeps: Docker's default set minus MKNOD (no new device nodes, so
 * no raw access to host disks). Everything else — SYS_ADMIN (mounts), SYS_PTRACE,
 * SYS_MODULE, DAC_READ_SEARCH (open_by_handle_at escapes), NET_ADMIN, SYS_RAWIO... — is
 * dropped from the bounding set, so not even a setuid binary in the guest regains it. */
static const int kept_caps[] = {
    CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_FSETID, CAP_KILL, CAP_SETGID,
    CAP_SETUID, CAP_SETPCAP, CAP_NET_BIND_SERVICE, CAP_NET_RAW, CAP_SYS_CHROOT,
    CAP_AUDIT_WRITE, CAP_SETFCAP,
};

static int drop_capabilities(void) {
    for (int cap = 0; cap <= 63; cap++) {
        int keep = 0;
        for (size_t i = 0; i < sizeof(kept_caps) / sizeof(kept_caps[0]); i++)
            if (kept_caps[i] == cap) keep = 1;
        if (keep) continue;
        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL) return -1;
    }
    /* Also drop them from the effective/permitted/inheritable sets of this process. */
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2];
    if (syscall(SYS_capget, &hdr, data) != 0) return -1;
    for (int w = 0; w < 2; w++) {
        __u32 mask = 0;
        for (size_t i = 0; i < sizeof(kept_caps) / sizeof(kept_caps[0]); i++)
            if (kept_caps[i] / 32 == w) mask |= 1u << (kept_caps[i] % 32);
        data[w].effective &= mask;
        data[w].permitted &= mask;
        data[w].inheritable &= mask;
    }
    return (int)syscall(SYS_capset, &hdr, data);
}

/* ---------------------------------------------------------------- sandbox init (PID 1) */

void set_title(const char *title) {
    /* /proc/1/cmdline would otherwise show the daemon's host socket path to the guest. */
    memset(g_argv[0], 0, g_argv_len);
    strncpy(g_argv[0], title, g_argv_len - 1);
    prctl(PR_SET_NAME, title, 0, 0, 0);
}

static void __attribute__((noreturn)) init_loop(void) {
    sigset_t all;
    sigfillset(&all);
    sigprocmask(SIG_BLOCK, &all, NULL);
    for (;;) {
        siginfo_t info;
        int sig = sigwaitinfo(&all, &info);
        if (sig == SIGCHLD) {
            while (waitpid(-1, NULL, WNOHANG) > 0) {
            }
        } else if (sig == SIGTERM || sig == SIGINT) {
            /* Leaving PID 1 ends the namespace: the kernel kills every guest process. */
            _exit(0);
        }
    }
}

struct create_req {
    const char *rootfs, *lower, *hostname, *seccomp, *dir, *park, *cgroupdir;
    const char *lxcfs; /* the runtime's lxcfs mount, when it has one (lxcfs.py) */
    const char *veth, *hostip, *guestip; /* the network link, when the sandbox has one */
    int prefix;
    unsigned long idbase;
    const char *cgroups[MAX_ITEMS];
    int ncgroups;
    const char *binds[MAX_ITEMS];
    int nbinds;
    const char *leave[MAX_ITEMS];
    int nleave;
};

static int report_fd = -1;
static pid_t g_listener; /* the listener process, parent of every handler */

static void __attribute__((noreturn)) fail(const char *step, const char *fmt, ...) {
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "ERR %s: ", step);
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (report_fd >= 0 && write(report_fd, msg, strlen(msg)) < 0) {
    }
    _exit(1);
}

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


static void loopback_up(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) fail("net", "socket: %s", strerror(errno));
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    strcpy(ifr.ifr_name, "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) fail("net", "lo flags: %s", strerror(errno));
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) != 0) fail("net", "lo up: %s", strerror(errno));
    close(s);
}

/* Runs as PID 1 of the new pid namespace, inside the new mount namespace. */
/* ---------------------------------------------------------------------------- seccomp */

/* A BPF program exported by `sandboxd seccomp-compile`, loaded without no_new_privs: a
 * setuid program in the guest (sudo) must keep working, so the caller must still hold
 * CAP_SYS_ADMIN when it applies it; everything the process starts inherits the filter. */
static struct sock_filter seccomp_prog[4096];
static struct sock_fprog seccomp_fprog;

/* Read the program first (the path may be gone once we are inside the guest's root)... */
static int read_seccomp(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, seccomp_prog, sizeof seccomp_prog);
    close(fd);
    if (n <= 0 || n % (ssize_t)sizeof seccomp_prog[0] != 0 || n == (ssize_t)sizeof seccomp_prog) {
        errno = EINVAL;
        return -1;
    }
    seccomp_fprog.len = (unsigned short)(n / (ssize_t)sizeof seccomp_prog[0]);
    seccomp_fprog.filter = seccomp_prog;
    return 0;
}

/* ...then apply it, as late as possible. */
static int apply_seccomp(void) {
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_fprog);
}

static int parse_cmp(char **tok, struct scmp_arg_cmp *cmp) {
    /* ARG OP VALUE [MASK-DATUM] */
    if (!tok[0] || !tok[1] || !tok[2]) return -1;
    unsigned arg = (unsigned)strtoul(tok[0], NULL, 10);
    unsigned long long a = strtoull(tok[2], NULL, 0), b = tok[3] ? strtoull(tok[3], NULL, 0) : 0;
    enum scmp_compare op;
    if (!strcmp(tok[1], "eq")) op = SCMP_CMP_EQ;
    else if (!strcmp(tok[1], "ne")) op = SCMP_CMP_NE;
    else if (!strcmp(tok[1], "lt")) op = SCMP_CMP_LT;
    else if (!strcmp(tok[1], "le")) op = SCMP_CMP_LE;
    else if (!strcmp(tok[1], "gt")) op = SCMP_CMP_GT;
    else if (!strcmp(tok[1], "ge")) op = SCMP_CMP_GE;
    else if (!strcmp(tok[1], "masked_eq")) op = SCMP_CMP_MASKED_EQ;
    else return -1;
    *cmp = (struct scmp_arg_cmp){.arg = arg, .op = op, .datum_a = a, .datum_b = b};
    return 0;
}

/* Compile a policy (see e2bfacade/runtime/local/seccomp.py) into a BPF program file. */
static int run_seccomp_compile(const char *policy, const char *out) {
    FILE *f = fopen(policy, "re");
    if (!f) { perror(policy); return 1; }
    char line[512];
    scmp_filter_ctx ctx = NULL;
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *tok[8] = {0};
        int nt = 0;
        for (char *t = strtok(line, " \t\n"); t && nt < 8; t = strtok(NULL, " \t\n")) tok[nt++] = t;
        if (nt == 0) continue;
        if (!strcmp(tok[0], "default") && nt == 3 && !ctx) {
            ctx = seccomp_init(SCMP_ACT_ERRNO((unsigned)atoi(tok[2])));
            if (!ctx) { fprintf(stderr, "seccomp_init failed\n"); return 1; }
            /* No NNP (setuid programs must work); other architectures are killed. */
            seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
            seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
            continue;
        }
        if (!ctx || nt < 2) { rc = -EINVAL; break; }
        int nr = (tok[1][0] >= '0' && tok[1][0] <= '9') ? atoi(tok[1])
                                                         : seccomp_syscall_resolve_name(tok[1]);
        if (nr == __NR_SCMP_ERROR) continue; /* a call this architecture does not have */
        uint32_t action;
        char **cmp_tok;
        if (!strcmp(tok[0], "allow")) { action = SCMP_ACT_ALLOW; cmp_tok = tok + 2; }
        else if (!strcmp(tok[0], "errno") && nt >= 3) {
            action = SCMP_ACT_ERRNO((unsigned)atoi(tok[2]));
            cmp_tok = tok + 3;
        } else { rc = -EINVAL; break; }
        if (cmp_tok[0]) {
            struct scmp_arg_cmp cmp;
            if (parse_cmp(cmp_tok, &cmp) != 0) { rc = -EINVAL; break; }
            rc = seccomp_rule_add_array(ctx, action, nr, 1, &cmp);
        } else {
            rc = seccomp_rule_add_array(ctx, action, nr, 0, NULL);
        }
        if (rc != 0) break;
    }
    fclose(f);
    if (rc != 0 || !ctx) {
        fprintf(stderr, "%s:%d: %s\n", policy, lineno, rc ? strerror(-rc) : "no default line");
        return 1;
    }
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { perror(out); return 1; }
    rc = seccomp_export_bpf(ctx, fd);
    close(fd);
    seccomp_release(ctx);
    if (rc != 0) { fprintf(stderr, "export: %s\n", strerror(-rc)); return 1; }
    return 0;
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

/* ------------------------------------------------------------------- user namespaces */
#define MAX_FDS 32
#define ID_RANGE 65536
static int sync_fd = -1;

static int send_fds(int sock, const int *fds, int n) {
    char byte = 'G';
    struct iovec iov = {&byte, 1};
    union { char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)]; struct cmsghdr align; } cbuf;
    memset(&cbuf, 0, sizeof cbuf);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (n > 0) {
        msg.msg_control = cbuf.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)n);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)n);
        memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)n);
    }
    return sendmsg(sock, &msg, 0) == 1 ? 0 : -1;
}

static int recv_fds(int sock, int *fds, int max) {
    char byte;
    struct iovec iov = {&byte, 1};
    union { char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)]; struct cmsghdr align; } cbuf;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                         .msg_controllen = sizeof cbuf.buf};
    if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
    int n = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        if (n > max) n = max;
        memcpy(fds, CMSG_DATA(c), sizeof(int) * (size_t)n);
    }
    return n;
}

/* A detached copy of the mount at PATH whose files the sandbox's user namespace sees with
 * its ids: a file of host uid N appears as guest uid N (host BASE + N on disk is what the
 * guest's own writes become). Read-only, no devices. Must be made by host root. */
static int idmapped_clone(const char *path, int userns_fd) {
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, path,
                         OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_RECURSIVE);
    if (t < 0) return -1;
    struct mount_attr a = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV,
                           .userns_fd = (unsigned long long)userns_fd};
    if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH | AT_RECURSIVE, &a, sizeof a) != 0) {
        int e = errno;
        close(t);
        errno = e;
        return -1;
    }
    return t;
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

/* The runtime's lxcfs mount, cloned for one sandbox: read-only, not idmapped (its files are
 * 0444; FUSE here cannot be idmapped). Host root makes it; the init attaches it. */
static int lxcfs_clone(const char *path) {
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (t < 0) return -1;
    struct mount_attr a = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV |
                                       MOUNT_ATTR_NOEXEC};
    if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &a, sizeof a) != 0) {
        int e = errno;
        close(t);
        errno = e;
        return -1;
    }
    return t;
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

static void __attribute__((noreturn)) sandbox_init(struct create_req *r) {
    /* The init's environment is readable by the guest (/proc/1/environ): keep none of ours. */
    clearenv();
    /* The daemon writes our id maps and makes the idmapped mounts of the image layers and
     * host binds (it must: they need host root), then hands them over. */
    int fds[MAX_FDS];
    int nlower = 1;
    for (const char *c = r->lower; *c; c++) nlower += *c == ':';
    int nfds = recv_fds(sync_fd, fds, MAX_FDS);
    int expected = nlower + r->nbinds + (r->lxcfs ? 1 : 0);
    if (nfds != expected) fail("userns", "got %d mounts, expected %d", nfds, expected);
    close(sync_fd);
    /* We are in the sandbox's directory (the maker went there as host root) and, with our
     * maps written, its host uid BASE is our uid 0: the guest's root, owning the upper
     * layer. Drop whatever groups of the host's are left. */
    if (setgroups(0, NULL) != 0 || setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
        fail("userns", "become guest root: %s", strerror(errno));
    /* The guest agent's socket, in the sandbox's host directory: the host's way in, and a
     * path the guest never sees (it is outside the root we pivot into). */
    int agent_fd = agent_listen("agent.sock");
    if (agent_fd < 0) fail("agent", "listen: %s", strerror(errno));
    /* The daemon's umask (077, for its own sockets) ends here: the guest's init, its agent
     * and every command get a machine's usual 022, as envd's do. */
    umask(022);
    /* Nothing we mount may propagate back to the host. */
    mount_or_fail(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL);
    /* Mount points for the layers, in memory: nothing to make or clean up on the disk. */
    mount_or_fail("tmpfs", "stage", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=700");
    char opts[REQ_MAX], stage[64];
    for (int i = 0; i < nlower; i++) {
        snprintf(stage, sizeof stage, "stage/l%d", i);
        if (mkdir(stage, 0700) != 0) fail("stage", "%s: %s", stage, strerror(errno));
    }
    for (int i = 0; i < r->nbinds; i++) {
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
        attach(fds[nlower + i], bstage);
        snprintf(bopts, sizeof bopts, "lowerdir=%s:../stage/empty,userxattr,redirect_dir=nofollow",
                 bstage);
        mount_or_fail("overlay", dst, "overlay", MS_RDONLY | MS_NODEV, bopts);
    }

    const char *dirs[] = {"proc", "sys", "dev", "tmp", "run"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        require_dir_or_absent(dirs[i]);
        mkdir_p_in(dirs[i], 0755);
    }
    int tmpfd = open("tmp", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (tmpfd < 0 || fchmod(tmpfd, 01777) != 0) fail("chmod", "/tmp: %s", strerror(errno));
    close(tmpfd);

    mount_or_fail("proc", "proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    /* Global kernel knobs stay read-only (a writable core_pattern is a classic escape). */
    const char *ro_proc[] = {"proc/sys", "proc/sysrq-trigger", "proc/irq", "proc/bus", "proc/fs"};
    for (size_t i = 0; i < sizeof ro_proc / sizeof ro_proc[0]; i++)
        if (access(ro_proc[i], F_OK) == 0) bind_readonly(ro_proc[i], ro_proc[i], MS_NOSUID);
    if (own_boot_id() != 0) fail("boot_id", "%s", strerror(errno));
    bind_readonly("../stage/boot_id", "proc/sys/kernel/random/boot_id",
                  MS_NOSUID | MS_NODEV | MS_NOEXEC);
    if (r->lxcfs) bind_lxcfs(fds[nlower + r->nbinds]);
    mount_or_fail("sysfs", "sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL);
    for (size_t i = 0; i < sizeof masked_paths / sizeof masked_paths[0]; i++)
        mask_path(masked_paths[i]);

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

    /* pivot_root(".", ".") stacks the old root under the new one; detaching it leaves the
     * guest with no path back to the host's file system. */
    if (syscall(SYS_pivot_root, ".", ".") != 0) fail("pivot_root", "%s", strerror(errno));
    if (umount2(".", MNT_DETACH) != 0) fail("umount old root", "%s", strerror(errno));
    if (chdir("/") != 0) fail("chdir", "/: %s", strerror(errno));

    if (sethostname(r->hostname, strlen(r->hostname)) != 0)
        fail("hostname", "%s", strerror(errno));
    loopback_up();
    set_title("e2b-init");
    /* A keyring of its own: not host root's session keyring, inherited from sandboxd. */
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0)
        fail("keyring", "%s", strerror(errno));
    if (apply_seccomp() != 0) fail("seccomp", "%s", strerror(errno));
    if (drop_capabilities() != 0) fail("capabilities", "%s", strerror(errno));
    /* Not dumpable: the guest cannot ptrace its init, read its memory or environment, or
     * follow /proc/1/exe to the host's sandboxd binary. */
    if (prctl(PR_SET_DUMPABLE, 0) != 0) fail("dumpable", "%s", strerror(errno));

    int devnull = open("/dev/null", O_RDWR);
    if (devnull < 0) fail("open", "/dev/null: %s", strerror(errno));
    /* The agent runs the guest's commands (agent.c), with exactly what we have now: guest
     * root, the filter, the reduced capabilities, not dumpable. */
    pid_t agent = fork();
    if (agent < 0) fail("agent", "fork: %s", strerror(errno));
    if (agent == 0) {
        for (int fd = 0; fd < 3; fd++) dup2(devnull, fd);
        agent_main(agent_fd);
    }
    close(agent_fd);
    if (write(report_fd, "OK", 2) != 2) _exit(1);
    for (int fd = 0; fd < 3; fd++) dup2(devnull, fd);
    closefrom(3);
    init_loop();
}

static int parse_request(char *buf, size_t len, struct create_req *r) {
    memset(r, 0, sizeof *r);
    size_t off = 0;
    while (off < len && buf[off] != 0) {
        char *item = buf + off;
        off += strlen(item) + 1;
        char *eq = strchr(item, '=');
        if (!eq) return -1;
        *eq = 0;
        char *v = eq + 1;
        if (!strcmp(item, "rootfs")) r->rootfs = v;
        else if (!strcmp(item, "lower")) r->lower = v;
        else if (!strcmp(item, "hostname")) r->hostname = v;
        else if (!strcmp(item, "seccomp")) r->seccomp = v;
        else if (!strcmp(item, "dir")) r->dir = v;
        else if (!strcmp(item, "lxcfs")) r->lxcfs = v;
        else if (!strcmp(item, "park")) r->park = v;
        else if (!strcmp(item, "cgroupdir")) r->cgroupdir = v;
        else if (!strcmp(item, "idbase")) r->idbase = strtoul(v, NULL, 10);
        else if (!strcmp(item, "veth")) r->veth = v;
        else if (!strcmp(item, "hostip")) r->hostip = v;
        else if (!strcmp(item, "guestip")) r->guestip = v;
        else if (!strcmp(item, "prefix")) r->prefix = (int)strtol(v, NULL, 10);
        else if (!strcmp(item, "cgroup") && r->ncgroups < MAX_ITEMS) r->cgroups[r->ncgroups++] = v;
        else if (!strcmp(item, "bind") && r->nbinds < MAX_ITEMS) r->binds[r->nbinds++] = v;
        else if (!strcmp(item, "leave") && r->nleave < MAX_ITEMS) r->leave[r->nleave++] = v;
        else return -1;
    }
    if (off >= len) return -1; /* no terminating empty string */
    if (r->park) return r->ncgroups > 0 && !r->rootfs && !r->cgroupdir ? 0 : -1;
    if (r->veth && !(r->hostip && r->guestip && r->prefix)) return -1;
    return (r->rootfs && r->lower && r->hostname) ? 0 : -1;
}

static void reply(int conn, const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    strcat(msg, "\n");
    if (write(conn, msg, strlen(msg)) < 0) {
    }
}

static int write_file(const char *path, const char *value) {
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, value, strlen(value));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(value) ? 0 : -1;
}

static int read_request(int conn, char *buf, size_t size, struct create_req *r) {
    size_t len = 0;
    for (;;) {
        ssize_t n = read(conn, buf + len, size - len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
        if (len >= 2 && buf[len - 1] == 0 && buf[len - 2] == 0) break;
        if (len == size) break;
    }
    return len == 0 ? -1 : parse_request(buf, len, r);
}

/* A parked launcher: joins the spare groups it was given now, while nobody waits, and then
 * waits on a socket of its own (PATH) for the one create it will serve. The caller renames
 * the groups to the sandbox's name and writes its limits before connecting, so the create
 * needs no cgroup migration: on cgroup v1 a migration waits for an RCU grace period (8 to
 * 16 ms) whenever none happened on the host just before, which is the usual case for an
 * interactive create. Returns the create's connection. */
static int park(int conn, struct create_req *r) {
    /* A spare dies with its listener: a sandbox launched by a spare whose daemon is gone
     * could be re-parented past the keeper to the host's PID 1, which may never reap it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != g_listener) _exit(1);
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (ls < 0 || strlen(r->park) >= sizeof addr.sun_path) {
        reply(conn, "ERR park: socket: %s", ls < 0 ? strerror(errno) : "path too long");
        _exit(1);
    }
    strcpy(addr.sun_path, r->park);
    umask(077);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(ls, 1) != 0) {
        reply(conn, "ERR park: listen on %s: %s", r->park, strerror(errno));
        _exit(1);
    }
    reply(conn, "OK parked %d", getpid());
    close(conn);
    char title[sizeof addr.sun_path + 16];
    snprintf(title, sizeof title, "sandboxd-spare %s", r->park);
    set_title(title);
    for (;;) {
        int c = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (c >= 0) {
            close(ls);
            return c;
        }
        if (errno != EINTR) _exit(1);
    }
}

/* One create request, in a process forked from the daemon. */
/* fork(), with the child born in the cgroup (v2) that ``cgroup_fd`` opens: clone3 with
 * CLONE_INTO_CGROUP (Linux 5.7). A raw syscall, as glibc has no wrapper; safe here, where
 * the caller is a single-threaded handler that forks and execs nothing else at once. */
static pid_t fork_into_cgroup(int cgroup_fd) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = SIGCHLD;
    args.cgroup = (__u64)cgroup_fd;
    return (pid_t)syscall(SYS_clone3, &args, sizeof args);
}

static void __attribute__((noreturn)) handle(int conn) {
    static char buf[REQ_MAX];
    struct create_req r;
    if (read_request(conn, buf, sizeof buf, &r) != 0) {
        reply(conn, "ERR request: malformed");
        _exit(1);
    }
    /* Join the sandbox's cgroups before creating anything: the namespaces, the init and
     * every page and task the guest ever makes are then charged to the sandbox, never to
     * the daemon. (This handler leaves them again by exiting in a moment.) */
    char pidstr[32];
    snprintf(pidstr, sizeof pidstr, "%d", getpid());
    for (int i = 0; i < r.ncgroups; i++) {
        if (write_file(r.cgroups[i], pidstr) != 0) {
            reply(conn, "ERR cgroup: %s: %s", r.cgroups[i], strerror(errno));
            _exit(1);
        }
    }
    int parked = r.park != NULL;
    if (parked) {
        conn = park(conn, &r);
        if (read_request(conn, buf, sizeof buf, &r) != 0 || r.park || r.ncgroups || r.nleave ||
            r.cgroupdir) {
            reply(conn, "ERR request: malformed");
            _exit(1);
        }
    }
    /* Open the groups to leave now: once the init pivots the root of the mount namespace we
     * share with it, the host's /sys is no longer reachable by path. */
    int leave_fds[MAX_ITEMS];
    for (int i = 0; i < r.nleave; i++) {
        leave_fds[i] = open(r.leave[i], O_WRONLY | O_CLOEXEC);
        if (leave_fds[i] < 0) {
            reply(conn, "ERR cgroup: %s: %s", r.leave[i], strerror(errno));
            _exit(1);
        }
    }
    int rep[2];
    if (pipe2(rep, O_CLOEXEC) != 0) {
        reply(conn, "ERR pipe: %s", strerror(errno));
        _exit(1);
    }
    int sync[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sync) != 0) {
        reply(conn, "ERR socketpair: %s", strerror(errno));
        _exit(1);
    }
    if (r.idbase == 0 || !r.dir) {
        reply(conn, "ERR request: no idbase or dir");
        _exit(1);
    }
    /* The sandbox's user namespace is made by a child that has become the sandbox's own
     * host uid (BASE) first: the kernel charges per-user limits (inotify instances, user
     * namespaces, ...) in the host's namespace to the namespace's owner, so each sandbox
     * has its own, never host root's or another sandbox's. The other namespaces are made
     * with it and owned by it: guest root holds its capabilities over them and over nothing
     * of the host. A cgroup namespace rooted at the sandbox's group: the guest sees "/"
     * there, never the host's cgroup paths (made after joining the groups). */
    int go[2];
    if (pipe2(go, O_CLOEXEC) != 0) {
        reply(conn, "ERR pipe: %s", strerror(errno));
        _exit(1);
    }
    /* cgroup v2: the maker is born in the sandbox's group (and with it the namespaces, the
     * init and all it makes), instead of the handler joining it first: no migration, so
     * no wait for the kernel's cgroup lock (which v1 pays on a quiet host; spares.py). */
    int cgroup_fd = -1;
    if (r.cgroupdir && (cgroup_fd = open(r.cgroupdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        reply(conn, "ERR cgroup: %s: %s", r.cgroupdir, strerror(errno));
        _exit(1);
    }
    pid_t maker = cgroup_fd >= 0 ? fork_into_cgroup(cgroup_fd) : fork();
    if (maker < 0) {
        reply(conn, "ERR %s: %s", cgroup_fd >= 0 ? "clone3 into cgroup" : "fork", strerror(errno));
        _exit(1);
    }
    if (cgroup_fd >= 0) close(cgroup_fd); /* both sides: no guest may inherit a host group */
    if (maker == 0) {
        close(rep[0]);
        close(sync[0]);
        close(conn);
        /* Into the sandbox's directory while still host root (its path is root's, 0700);
         * from here on every path is relative to it, so no host directory is walked again. */
        /* The guests' filter too, while its file is readable (applied by the init, last). */
        if (!r.seccomp || read_seccomp(r.seccomp) != 0) {
            dprintf(rep[1], "ERR seccomp: %s: %s", r.seccomp ? r.seccomp : "no filter given",
                    strerror(errno));
            _exit(1);
        }
        gid_t base_gid = (gid_t)r.idbase;
        uid_t base_uid = (uid_t)r.idbase;
        if (chdir(r.dir) != 0 || setgroups(0, NULL) != 0 || setresgid(base_gid, base_gid, base_gid) != 0 ||
            setresuid(base_uid, base_uid, base_uid) != 0 ||
            unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
                    CLONE_NEWPID | CLONE_NEWCGROUP) != 0) {
            dprintf(rep[1], "ERR namespaces: %s", strerror(errno));
            _exit(1);
        }
        /* Tell the daemon to write our id maps, and wait until it has; the pid namespace is
         * for our child, PID 1. */
        close(go[1]);
        char ok;
        if (send(sync[1], "U", 1, 0) != 1 || read(go[0], &ok, 1) != 1) _exit(1);
        close(go[0]);
        pid_t init = fork();
        if (init < 0) {
            dprintf(rep[1], "ERR fork: %s", strerror(errno));
            _exit(1);
        }
        if (init == 0) {
            report_fd = rep[1];
            sync_fd = sync[1];
            sandbox_init(&r);
        }
        char msg[32];
        int len = snprintf(msg, sizeof msg, "P%d", init);
        _exit(send(sync[1], msg, (size_t)len, 0) == len ? 0 : 1);
    }
    close(sync[1]);
    close(go[0]);
    char msg[32] = {0};
    if (recv(sync[0], msg, sizeof msg - 1, 0) != 1 || msg[0] != 'U') {
        waitpid(maker, NULL, 0);
        char status[1100] = {0};
        ssize_t n = read(rep[0], status, sizeof status - 1);
        reply(conn, "%s", n > 0 ? status : "ERR namespaces: the maker died");
        _exit(1);
    }
    pid_t child = maker; /* whose user namespace we set up; the init's pid comes below */
    /* The guest's ids 0..65535 are host ids BASE..BASE+65535, this sandbox's alone. */
    char path[64], map[64];
    snprintf(map, sizeof map, "0 %lu %d\n", r.idbase, ID_RANGE);
    const char *maps[] = {"uid_map", "gid_map"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/proc/%d/%s", child, maps[i]);
        if (write_file(path, map) != 0) {
            kill(child, SIGKILL);
            reply(conn, "ERR userns: %s: %s", maps[i], strerror(errno));
            _exit(1);
        }
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", child);
    int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (write(go[1], "G", 1) != 1) {
        kill(child, SIGKILL);
        reply(conn, "ERR userns: %s", strerror(errno));
        _exit(1);
    }
    close(go[1]);
    int fds[MAX_FDS], nfds = 0;
    char lower[REQ_MAX];
    snprintf(lower, sizeof lower, "%s", r.lower);
    for (char *tok = strtok(lower, ":"); tok && userns >= 0 && nfds < MAX_FDS; tok = strtok(NULL, ":")) {
        if ((fds[nfds++] = idmapped_clone(tok, userns)) < 0) break;
    }
    for (int i = 0; i < r.nbinds && userns >= 0 && nfds < MAX_FDS; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s", r.binds[i]);
        char *colon = strchr(src, ':');
        if (colon) *colon = 0;
        if ((fds[nfds++] = idmapped_clone(src, userns)) < 0) break;
    }
    if (r.lxcfs && userns >= 0 && nfds < MAX_FDS && (nfds == 0 || fds[nfds - 1] >= 0))
        fds[nfds++] = lxcfs_clone(r.lxcfs);
    if (userns < 0 || (nfds > 0 && fds[nfds - 1] < 0) || send_fds(sync[0], fds, nfds) != 0) {
        kill(child, SIGKILL);
        reply(conn, "ERR userns: idmapped mounts: %s", strerror(errno));
        _exit(1);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    close(userns);
    memset(msg, 0, sizeof msg);
    ssize_t got = recv(sync[0], msg, sizeof msg - 1, 0);
    waitpid(maker, NULL, 0);
    close(sync[0]);
    if (got < 2 || msg[0] != 'P') {
        reply(conn, "ERR init: not started");
        _exit(1);
    }
    child = (pid_t)strtol(msg + 1, NULL, 10); /* the init: the daemon's to reap from now */
    close(rep[1]);
    char status[1100] = {0};
    ssize_t n = read(rep[0], status, sizeof status - 1);
    if (n == 2 && !memcmp(status, "OK", 2) && r.veth) {
        /* The init runs in its namespaces: give it its link to the host (net.c). */
        char err[256];
        if (net_setup(child, r.veth, r.hostip, r.guestip, r.prefix, err, sizeof err) != 0)
            n = snprintf(status, sizeof status, "ERR net: %s", err);
    }
    if (n == 2 && !memcmp(status, "OK", 2) && parked) {
        /* We stay in the sandbox's groups (leaving would be a migration): the caller waits
         * for us to exit, which it sees on a pidfd once it closes the connection. */
        reply(conn, "OK %d %d", child, getpid());
        char ack;
        while (read(conn, &ack, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    if (n == 2 && !memcmp(status, "OK", 2)) {
        /* Step out of the sandbox's groups before answering, so that when the caller looks,
         * the init is the sandbox's only process. What we were charged stays charged. */
        for (int i = 0; i < r.nleave; i++) {
            if (write(leave_fds[i], pidstr, strlen(pidstr)) < 0) {
                kill(child, SIGKILL);
                reply(conn, "ERR cgroup: leave %s: %s", r.leave[i], strerror(errno));
                _exit(1);
            }
        }
        reply(conn, "OK %d", child);
        _exit(0);
    }
    kill(child, SIGKILL);
    reply(conn, "%s", n > 0 ? status : "ERR init: exited before reporting");
    _exit(1);
}

static void on_sigchld(int sig) {
    (void)sig;
    int saved = errno;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    errno = saved;
}

static int serve(const char *sock_path);

/* The keeper: a subreaper that does nothing but wait. The listener (which parses requests
 * and so is the part that can crash) is its child; a sandbox's init, once its handler exits,
 * is re-parented to the nearest subreaper, the keeper, so a crashed or killed listener never
 * leaves sandboxes without a reaper. The keeper exits when it has no children left. */
static int run_daemon(const char *sock_path) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) {
        perror("sandboxd: PR_SET_CHILD_SUBREAPER");
        return 1;
    }
    pid_t listener = fork();
    if (listener < 0) {
        perror("sandboxd: fork");
        return 1;
    }
    if (listener == 0) return serve(sock_path);
    char title[256];
    snprintf(title, sizeof title, "sandboxd-keeper %s", sock_path);
    set_title(title);
    signal(SIGPIPE, SIG_IGN);
    while (wait(NULL) > 0 || errno == EINTR) {
    }
    return 0;
}

static int serve(const char *sock_path) {
    g_listener = getpid();
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    if (strlen(sock_path) >= sizeof addr.sun_path) {
        fprintf(stderr, "sandboxd: socket path too long: %s\n", sock_path);
        return 1;
    }
    strcpy(addr.sun_path, sock_path);
    char tmp[sizeof addr.sun_path + 8];
    /* Bind a temporary name and rename it into place: a client never connects to a socket
     * that is not yet listening, and a stale socket of a dead daemon is replaced atomically. */
    snprintf(tmp, sizeof tmp, "%s.%d", sock_path, getpid());
    struct sockaddr_un taddr = addr;
    if (strlen(tmp) >= sizeof taddr.sun_path) {
        fprintf(stderr, "sandboxd: socket path too long: %s\n", tmp);
        return 1;
    }
    strcpy(taddr.sun_path, tmp);
    unlink(tmp);
    umask(077);
    if (bind(s, (struct sockaddr *)&taddr, sizeof taddr) != 0 || listen(s, 128) != 0 ||
        rename(tmp, sock_path) != 0) {
        fprintf(stderr, "sandboxd: listen on %s: %s\n", sock_path, strerror(errno));
        return 1;
    }
    for (;;) {
        int conn = accept4(s, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno == EINTR) continue;
            perror("sandboxd: accept");
            continue;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(s);
            handle(conn);
        }
        if (pid < 0) reply(conn, "ERR fork: %s", strerror(errno));
        close(conn);
    }
}

int main(int argc, char **argv) {
    g_argv = argv;
    g_argv_len = 0;
    for (int i = 0; i < argc; i++) g_argv_len += strlen(argv[i]) + 1;
    if (argc == 3 && !strcmp(argv[1], "daemon")) return run_daemon(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "seccomp-compile")) return run_seccomp_compile(argv[2], argv[3]);
    fprintf(stderr, "usage: sandboxd daemon SOCKET | sandboxd seccomp-compile POLICY OUT\n");
    return 2;
}
