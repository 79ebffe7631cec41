/*
 * sandboxd: the privileged helper of e2bfacade's local runtime.
 *
 * Two modes, one static binary with the guest agent (built by e2bfacade/runtime/local/build.py
 * from every file of this folder):
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
 * Each sandbox's init also forks the guest agent (agent_conn.c), which runs the guest's
 * commands; the host reaches it on the socket the init binds in the sandbox's directory.
 *
 * The files:
 *   daemon.c      this: the keeper, the listener (listen, accept, fork a handler), main
 *   launch.c      a handler: the request (its wire format is there), the namespaces, the
 *                 id maps, the idmapped mounts, the init's report, spare launchers (park)
 *   init.c        the sandbox's PID 1: guest root, capabilities, seccomp, agent, reaping
 *   rootfs.c      the guest's root: overlay layers, binds, /proc, /sys, /dev, pivot_root
 *   seccomp.c     the guests' filter: compiled (seccomp-compile), read, applied
 *   net.c         the sandbox's veth pair
 *   agent_*.c     the guest agent (agent.h)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "launcher.h"
#include "sandboxd.h"

static char **g_argv;
static size_t g_argv_len;
pid_t g_listener;

void set_title(const char *title) {
    /* /proc/1/cmdline would otherwise show the daemon's host socket path to the guest. */
    memset(g_argv[0], 0, g_argv_len);
    strncpy(g_argv[0], title, g_argv_len - 1);
    prctl(PR_SET_NAME, title, 0, 0, 0);
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
            handle_create(conn);
        }
        if (pid < 0) reply(conn, "ERR fork: %s", strerror(errno));
        close(conn);
    }
}

/* The reaper of a command that leaves processes behind it (the gVisor driver's runsc create
 * and restore, whose sandbox and gofer outlive them): run ARGV with /dev/null as its stdin
 * and stdout, tell the caller on our stdout how it ended ("<wait status>\n", then EOF), and
 * stay the subreaper of what it left until all of it has ended. Without it those processes
 * are orphaned to the host's PID 1, which on these VMs reaps them only a second or more
 * later (a runsc delete waits for that). */
static int run_keeper(char **cmd) {
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0) return 1;
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) return 1;
    pid_t child = fork();
    if (child < 0) return 1;
    if (child == 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        execvp(cmd[0], cmd);
        _exit(127);
    }
    int status = 0;
    while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
    }
    printf("%d\n", status);
    fflush(stdout);
    dup2(devnull, 1);
    dup2(devnull, 2);
    while (wait(NULL) > 0 || errno == EINTR) {
    }
    return 0;
}

int main(int argc, char **argv) {
    g_argv = argv;
    g_argv_len = 0;
    for (int i = 0; i < argc; i++) g_argv_len += strlen(argv[i]) + 1;
    if (argc == 3 && !strcmp(argv[1], "daemon")) return run_daemon(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "guest")) guest_init(atoi(argv[2]));
    if (argc >= 4 && !strcmp(argv[1], "keep") && !strcmp(argv[2], "--")) return run_keeper(argv + 3);
    /* A restored copy of a sandbox takes its own name (run by the gVisor driver in it). */
    if (argc == 3 && !strcmp(argv[1], "hostname"))
        return sethostname(argv[2], strlen(argv[2])) == 0 ? 0 : (perror("sethostname"), 1);
    if (argc == 4 && !strcmp(argv[1], "seccomp-compile")) return run_seccomp_compile(argv[2], argv[3]);
    fprintf(stderr, "usage: sandboxd daemon SOCKET | sandboxd guest PORT | sandboxd hostname NAME | sandboxd keep -- CMD... | sandboxd seccomp-compile POLICY OUT\n");
    return 2;
}
