/* The sandbox's PID 1: receives the mounts the handler made, becomes the guest's root, has
 * the root file system built (rootfs.c), confines itself (keyring, seccomp, capabilities, not
 * dumpable), forks the guest agent and then reaps the guest's orphans until the sandbox
 * ends. A failure is reported to the handler as "ERR <step>: <reason>" (fail). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <net/if.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/capability.h>
#include <linux/keyctl.h>

#include "launcher.h"
#include "sandboxd.h"

int report_fd = -1;
int sync_fd = -1;

void fail(const char *step, const char *fmt, ...) {
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

/* What the init keeps for itself and hands to everything it starts: a keyring of its own,
 * the guests' filter, the reduced capabilities, not dumpable. */
static void confine(void) {
    /* A keyring of its own: not host root's session keyring, inherited from sandboxd. */
    if (syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, NULL) < 0)
        fail("keyring", "%s", strerror(errno));
    if (apply_seccomp() != 0) fail("seccomp", "%s", strerror(errno));
    if (drop_capabilities() != 0) fail("capabilities", "%s", strerror(errno));
    /* Not dumpable: the guest cannot ptrace its init, read its memory or environment, or
     * follow /proc/1/exe to the host's sandboxd binary. */
    if (prctl(PR_SET_DUMPABLE, 0) != 0) fail("dumpable", "%s", strerror(errno));
}

/* Fork the guest agent on AGENT_FD, report the sandbox started, and become its reaper. */
static void __attribute__((noreturn)) start_agent(int agent_fd) {
    int devnull = open("/dev/null", O_RDWR);
    if (devnull < 0) fail("open", "/dev/null: %s", strerror(errno));
    /* The agent runs the guest's commands (agent_conn.c), with exactly what we have now:
     * guest root, the filter, the reduced capabilities, not dumpable. */
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

/* Runs as PID 1 of the new pid namespace, inside the new mount namespace. */
void sandbox_init(struct create_req *r) {
    /* The init's environment is readable by the guest (/proc/1/environ): keep none of ours. */
    clearenv();
    /* The daemon writes our id maps and makes the idmapped mounts of the image layers and
     * host binds (it must: they need host root), then hands them over. */
    int fds[MAX_FDS];
    int nlower = 1;
    for (const char *c = r->lower; *c; c++) nlower += *c == ':';
    int nfds = recv_fds(sync_fd, fds, MAX_FDS);
    int expected = nlower + r->nbinds + (r->lxcfs ? 1 : 0) + r->nvolumes;
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
    build_rootfs(r, fds, nlower); /* from here on "/" is the guest's */
    mount_volumes(r, fds + nlower + r->nbinds + (r->lxcfs ? 1 : 0));

    if (sethostname(r->hostname, strlen(r->hostname)) != 0)
        fail("hostname", "%s", strerror(errno));
    loopback_up();
    set_title("e2b-init");
    confine();
    start_agent(agent_fd);
}

/* PID 1 inside a sandbox that gVisor isolates: the kernel it talks to is gVisor's, which
 * already gave it its root, namespaces, capabilities and limits from the OCI bundle. What
 * is left is sandbox_init's tail: the agent, on TCP (no host path reaches into gVisor), and
 * the reaping loop. A failure exits, and the driver sees the sandbox stop. */
void guest_init(int port) {
    clearenv();
    umask(022);
    int agent_fd = agent_listen_tcp(port);
    if (agent_fd < 0) _exit(1);
    set_title("e2b-init");
    if (prctl(PR_SET_DUMPABLE, 0) != 0) _exit(1);
    int devnull = open("/dev/null", O_RDWR);
    if (devnull < 0) _exit(1);
    pid_t agent = fork();
    if (agent < 0) _exit(1);
    if (agent == 0) {
        for (int fd = 0; fd < 3; fd++) dup2(devnull, fd);
        agent_main(agent_fd);
    }
    close(agent_fd);
    for (int fd = 0; fd < 3; fd++) dup2(devnull, fd);
    closefrom(3);
    init_loop();
}
