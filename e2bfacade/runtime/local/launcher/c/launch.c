/*
 * A create request's handler, in a process forked from the listener (daemon.c): the
 * request, the sandbox's cgroups, the maker (which becomes the sandbox's host id and makes
 * its namespaces), the id maps and idmapped mounts only host root can make, the init's
 * report, the network link, the answer.
 *
 * Create requests are NUL-separated "key=value" strings ended by an empty string:
 *   rootfs=DIR lower=A:B hostname=NAME cgroup=PROCS_FILE (repeatable)
 *   (the writable layer is disk/upper, with disk/work, in the sandbox's directory DIR)
 *   bind=SRC:DST (read-only host bind, repeatable)
 *   volume=SRC:DST (a volume's host mount SRC, writable and idmapped, at the guest path
 *   DST; repeatable)
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
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sched.h> /* struct clone_args, CLONE_INTO_CGROUP */

#include "launcher.h"
#include "sandboxd.h"

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
        else if (!strcmp(item, "volume") && r->nvolumes < MAX_ITEMS) r->volumes[r->nvolumes++] = v;
        else if (!strcmp(item, "leave") && r->nleave < MAX_ITEMS) r->leave[r->nleave++] = v;
        else return -1;
    }
    if (off >= len) return -1; /* no terminating empty string */
    if (r->park) return r->ncgroups > 0 && !r->rootfs && !r->cgroupdir ? 0 : -1;
    if (r->veth && !(r->hostip && r->guestip && r->prefix)) return -1;
    return (r->rootfs && r->lower && r->hostname) ? 0 : -1;
}

void reply(int conn, const char *fmt, ...) {
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

/* A volume's host mount at PATH, cloned for one sandbox: writable, idmapped like the layers
 * (a file of guest uid N is stored as uid N whatever the sandbox's id range), no devices,
 * no set-id programs. Only the volume's own mount: nothing mounted below it comes along. */
static int volume_clone(const char *path, int userns_fd) {
    int t = (int)syscall(SYS_open_tree, AT_FDCWD, path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (t < 0) return -1;
    struct mount_attr a = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOSUID,
                           .attr_clr = MOUNT_ATTR_RDONLY,
                           .userns_fd = (unsigned long long)userns_fd};
    if (syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH, &a, sizeof a) != 0) {
        int e = errno;
        close(t);
        errno = e;
        return -1;
    }
    return t;
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

/* What one create's handler holds across its steps. */
struct launch {
    int conn;                 /* the caller's connection (a spare's: the create's) */
    struct create_req r;
    char pidstr[32];          /* the handler's own pid, as cgroup files take it */
    int parked;
    int leave_fds[MAX_ITEMS]; /* the groups to leave, opened before the pivot */
    int rep[2];               /* the init's report: "OK" or "ERR <step>: <reason>" */
    int sync[2];              /* handler <-> maker and init: "U", the mounts, "P<pid>" */
    int go[2];                /* handler -> maker: the id maps are written */
    pid_t maker;
};

static void __attribute__((noreturn)) refuse(int conn, const char *fmt, const char *a,
                                             const char *b) {
    reply(conn, fmt, a, b);
    _exit(1);
}

/* Join the sandbox's cgroups before creating anything: the namespaces, the init and every
 * page and task the guest ever makes are then charged to the sandbox, never to the daemon.
 * (This handler leaves them again by exiting in a moment.) */
static void join_cgroups(struct launch *l) {
    snprintf(l->pidstr, sizeof l->pidstr, "%d", getpid());
    for (int i = 0; i < l->r.ncgroups; i++)
        if (write_file(l->r.cgroups[i], l->pidstr) != 0)
            refuse(l->conn, "ERR cgroup: %s: %s", l->r.cgroups[i], strerror(errno));
}

/* A spare: park, then read the create it serves, which may not name groups of its own. */
static void serve_parked(struct launch *l, char *buf, size_t size) {
    l->conn = park(l->conn, &l->r);
    if (read_request(l->conn, buf, size, &l->r) != 0 || l->r.park || l->r.ncgroups ||
        l->r.nleave || l->r.cgroupdir) {
        reply(l->conn, "ERR request: malformed");
        _exit(1);
    }
}

/* Open the groups to leave now: once the init pivots the root of the mount namespace we
 * share with it, the host's /sys is no longer reachable by path. Then the channels to the
 * maker and the init. */
static void open_channels(struct launch *l) {
    for (int i = 0; i < l->r.nleave; i++) {
        l->leave_fds[i] = open(l->r.leave[i], O_WRONLY | O_CLOEXEC);
        if (l->leave_fds[i] < 0) refuse(l->conn, "ERR cgroup: %s: %s", l->r.leave[i], strerror(errno));
    }
    if (pipe2(l->rep, O_CLOEXEC) != 0) refuse(l->conn, "ERR pipe: %s", strerror(errno), NULL);
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, l->sync) != 0)
        refuse(l->conn, "ERR socketpair: %s", strerror(errno), NULL);
    if (l->r.idbase == 0 || !l->r.dir) {
        reply(l->conn, "ERR request: no idbase or dir");
        _exit(1);
    }
    if (pipe2(l->go, O_CLOEXEC) != 0) refuse(l->conn, "ERR pipe: %s", strerror(errno), NULL);
}

/* The maker, in the child: becomes the sandbox's base host id, makes the namespaces, waits
 * for its id maps and forks the init, whose pid it reports ("P<pid>") before exiting. */
static void __attribute__((noreturn)) run_maker(struct launch *l) {
    struct create_req *r = &l->r;
    close(l->rep[0]);
    close(l->sync[0]);
    close(l->conn);
    /* Into the sandbox's directory while still host root (its path is root's, 0700);
     * from here on every path is relative to it, so no host directory is walked again. */
    /* The guests' filter too, while its file is readable (applied by the init, last). */
    if (!r->seccomp || read_seccomp(r->seccomp) != 0) {
        dprintf(l->rep[1], "ERR seccomp: %s: %s", r->seccomp ? r->seccomp : "no filter given",
                strerror(errno));
        _exit(1);
    }
    gid_t base_gid = (gid_t)r->idbase;
    uid_t base_uid = (uid_t)r->idbase;
    if (chdir(r->dir) != 0 || setgroups(0, NULL) != 0 || setresgid(base_gid, base_gid, base_gid) != 0 ||
        setresuid(base_uid, base_uid, base_uid) != 0 ||
        unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWNET |
                CLONE_NEWPID | CLONE_NEWCGROUP) != 0) {
        dprintf(l->rep[1], "ERR namespaces: %s", strerror(errno));
        _exit(1);
    }
    /* Tell the daemon to write our id maps, and wait until it has; the pid namespace is
     * for our child, PID 1. */
    close(l->go[1]);
    char ok;
    if (send(l->sync[1], "U", 1, 0) != 1 || read(l->go[0], &ok, 1) != 1) _exit(1);
    close(l->go[0]);
    pid_t init = fork();
    if (init < 0) {
        dprintf(l->rep[1], "ERR fork: %s", strerror(errno));
        _exit(1);
    }
    if (init == 0) {
        report_fd = l->rep[1];
        sync_fd = l->sync[1];
        sandbox_init(r);
    }
    char msg[32];
    int len = snprintf(msg, sizeof msg, "P%d", init);
    _exit(send(l->sync[1], msg, (size_t)len, 0) == len ? 0 : 1);
}

/* The sandbox's user namespace is made by a child that has become the sandbox's own host uid
 * (BASE) first: the kernel charges per-user limits (inotify instances, user namespaces, ...)
 * in the host's namespace to the namespace's owner, so each sandbox has its own, never host
 * root's or another sandbox's. The other namespaces are made with it and owned by it: guest
 * root holds its capabilities over them and over nothing of the host. A cgroup namespace
 * rooted at the sandbox's group: the guest sees "/" there, never the host's cgroup paths
 * (made after joining the groups). */
static void start_maker(struct launch *l) {
    /* cgroup v2: the maker is born in the sandbox's group (and with it the namespaces, the
     * init and all it makes), instead of the handler joining it first: no migration, so
     * no wait for the kernel's cgroup lock (which v1 pays on a quiet host; spares.py). */
    int cgroup_fd = -1;
    if (l->r.cgroupdir &&
        (cgroup_fd = open(l->r.cgroupdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        refuse(l->conn, "ERR cgroup: %s: %s", l->r.cgroupdir, strerror(errno));
    l->maker = cgroup_fd >= 0 ? fork_into_cgroup(cgroup_fd) : fork();
    if (l->maker < 0)
        refuse(l->conn, "ERR %s: %s", cgroup_fd >= 0 ? "clone3 into cgroup" : "fork", strerror(errno));
    if (cgroup_fd >= 0) close(cgroup_fd); /* both sides: no guest may inherit a host group */
    if (l->maker == 0) run_maker(l);
    /* The report's write end is the maker's and the init's alone: with ours open, a maker
     * killed before it wrote would leave await_namespaces reading it for ever. */
    close(l->rep[1]);
    close(l->sync[1]);
    close(l->go[0]);
}

/* Wait for the maker's namespaces ("U"); if it died instead, pass its error on. */
static void await_namespaces(struct launch *l) {
    char msg[32] = {0};
    if (recv(l->sync[0], msg, sizeof msg - 1, 0) != 1 || msg[0] != 'U') {
        waitpid(l->maker, NULL, 0);
        char status[1100] = {0};
        ssize_t n = read(l->rep[0], status, sizeof status - 1);
        reply(l->conn, "%s", n > 0 ? status : "ERR namespaces: the maker died");
        _exit(1);
    }
}

/* The guest's ids 0..65535 are host ids BASE..BASE+65535, this sandbox's alone. Returns a
 * descriptor of the maker's user namespace (-1 if it could not be opened), and lets the maker
 * go on. */
static int write_id_maps(struct launch *l) {
    pid_t child = l->maker;
    char path[64], map[64];
    snprintf(map, sizeof map, "0 %lu %d\n", l->r.idbase, ID_RANGE);
    const char *maps[] = {"uid_map", "gid_map"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "/proc/%d/%s", child, maps[i]);
        if (write_file(path, map) != 0) {
            kill(child, SIGKILL);
            refuse(l->conn, "ERR userns: %s: %s", maps[i], strerror(errno));
        }
    }
    snprintf(path, sizeof path, "/proc/%d/ns/user", child);
    int userns = open(path, O_RDONLY | O_CLOEXEC);
    if (write(l->go[1], "G", 1) != 1) {
        kill(child, SIGKILL);
        refuse(l->conn, "ERR userns: %s", strerror(errno), NULL);
    }
    close(l->go[1]);
    return userns;
}

/* Make the idmapped clones of the image layers and host binds (and lxcfs's clone) in the
 * namespace USERNS and hand them to the init, in the order it attaches them. */
static void send_mounts(struct launch *l, int userns) {
    struct create_req *r = &l->r;
    int fds[MAX_FDS], nfds = 0;
    char lower[REQ_MAX];
    snprintf(lower, sizeof lower, "%s", r->lower);
    for (char *tok = strtok(lower, ":"); tok && userns >= 0 && nfds < MAX_FDS; tok = strtok(NULL, ":")) {
        if ((fds[nfds++] = idmapped_clone(tok, userns)) < 0) break;
    }
    for (int i = 0; i < r->nbinds && userns >= 0 && nfds < MAX_FDS; i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s", r->binds[i]);
        char *colon = strchr(src, ':');
        if (colon) *colon = 0;
        if ((fds[nfds++] = idmapped_clone(src, userns)) < 0) break;
    }
    if (r->lxcfs && userns >= 0 && nfds < MAX_FDS && (nfds == 0 || fds[nfds - 1] >= 0))
        fds[nfds++] = lxcfs_clone(r->lxcfs);
    for (int i = 0; i < r->nvolumes && userns >= 0 && (nfds == 0 || fds[nfds - 1] >= 0); i++) {
        char src[4096];
        snprintf(src, sizeof src, "%s", r->volumes[i]);
        char *colon = strchr(src, ':');
        if (!colon || nfds >= MAX_FDS) {
            kill(l->maker, SIGKILL);
            refuse(l->conn, "ERR volume: %s", colon ? "more mounts than MAX_FDS" : "malformed", NULL);
        }
        *colon = 0;
        fds[nfds++] = volume_clone(src, userns);
    }
    if (userns < 0 || (nfds > 0 && fds[nfds - 1] < 0) || send_fds(l->sync[0], fds, nfds) != 0) {
        kill(l->maker, SIGKILL);
        refuse(l->conn, "ERR userns: idmapped mounts: %s", strerror(errno), NULL);
    }
    for (int i = 0; i < nfds; i++) close(fds[i]);
    close(userns);
}

/* The init's pid, from the maker (which has exited: the init is the daemon's to reap). */
static pid_t await_init(struct launch *l) {
    char msg[32] = {0};
    ssize_t got = recv(l->sync[0], msg, sizeof msg - 1, 0);
    waitpid(l->maker, NULL, 0);
    close(l->sync[0]);
    if (got < 2 || msg[0] != 'P') {
        reply(l->conn, "ERR init: not started");
        _exit(1);
    }
    return (pid_t)strtol(msg + 1, NULL, 10);
}

/* The init's report, with its network link made once it runs: "OK" (N == 2) or an error. */
static ssize_t init_report(struct launch *l, pid_t init, char *status, size_t size) {
    ssize_t n = read(l->rep[0], status, size - 1);
    if (n == 2 && !memcmp(status, "OK", 2) && l->r.veth) {
        /* The init runs in its namespaces: give it its link to the host (net.c). */
        char err[256];
        if (net_setup(init, l->r.veth, l->r.hostip, l->r.guestip, l->r.prefix, err, sizeof err) != 0)
            n = snprintf(status, size, "ERR net: %s", err);
    }
    return n;
}

/* The sandbox runs: answer the caller. */
static void __attribute__((noreturn)) answer_started(struct launch *l, pid_t init) {
    if (l->parked) {
        /* We stay in the sandbox's groups (leaving would be a migration): the caller waits
         * for us to exit, which it sees on a pidfd once it closes the connection. */
        reply(l->conn, "OK %d %d", init, getpid());
        char ack;
        while (read(l->conn, &ack, 1) < 0 && errno == EINTR) {
        }
        _exit(0);
    }
    /* Step out of the sandbox's groups before answering, so that when the caller looks, the
     * init is the sandbox's only process. What we were charged stays charged. */
    for (int i = 0; i < l->r.nleave; i++) {
        if (write(l->leave_fds[i], l->pidstr, strlen(l->pidstr)) < 0) {
            kill(init, SIGKILL);
            refuse(l->conn, "ERR cgroup: leave %s: %s", l->r.leave[i], strerror(errno));
        }
    }
    reply(l->conn, "OK %d", init);
    _exit(0);
}

void handle_create(int conn) {
    static char buf[REQ_MAX];
    static struct launch l;
    l.conn = conn;
    if (read_request(conn, buf, sizeof buf, &l.r) != 0) {
        reply(conn, "ERR request: malformed");
        _exit(1);
    }
    join_cgroups(&l);
    l.parked = l.r.park != NULL;
    if (l.parked) serve_parked(&l, buf, sizeof buf);
    open_channels(&l);
    start_maker(&l);
    await_namespaces(&l);
    send_mounts(&l, write_id_maps(&l));
    pid_t init = await_init(&l);
    char status[1100] = {0};
    ssize_t n = init_report(&l, init, status, sizeof status);
    if (n == 2 && !memcmp(status, "OK", 2)) answer_started(&l, init);
    kill(init, SIGKILL);
    reply(l.conn, "%s", n > 0 ? status : "ERR init: exited before reporting");
    _exit(1);
}
