/* The shepherd: each command's parent inside the guest (e2b-exec in its process list),
 * forked by the agent (agent_proc.c's start). It forwards signals to the command, ends the
 * whole tree when the lifetime is over, reports the command's pid and end, and stays the
 * subreaper of what the command leaves behind. Also the builtin read. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <grp.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>

#include "agent.h"
#include "sandboxd.h"

static volatile sig_atomic_t shepherd_command = 0, shepherd_kill = 0;

static void shepherd_forward(int sig) {
    if (shepherd_command > 0) kill(-shepherd_command, sig);
}

static void shepherd_tree_kill(int sig) {
    (void)sig;
    shepherd_kill = 1;
    if (shepherd_command > 0) kill(-shepherd_command, SIGKILL);
}

/* Kill every descendant: each is our child or becomes one when its parent dies (we are
 * their subreaper), whatever session or group it moved to. Bounded: 2 s. */
static void kill_tree(void) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)syscall(SYS_gettid));
    for (int round = 0; round < 400; round++) {
        char buf[8192];
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0) close(fd);
        int any = 0;
        if (n > 0) {
            buf[n] = 0;
            for (char *tok = strtok(buf, " \n"); tok; tok = strtok(NULL, " \n")) {
                pid_t pid = (pid_t)strtol(tok, NULL, 10), group = getpgid(pid);
                if (pid <= 0) continue;
                /* Its whole group at once (not ours: the agent's): a fork bomb's processes
                 * share one, and killing them one by one, each freed pid is forked into. */
                if (group > 0 && group != getpgrp()) kill(-group, SIGKILL);
                kill(pid, SIGKILL);
                any = 1;
            }
        }
        while (waitpid(-1, NULL, WNOHANG) > 0) {
        }
        if (!any) return;
        usleep(5000);
    }
}

/* Wait for the command, reaping on the way whatever else ends under us (an orphan of the
 * command is re-parented to us: a zombie left unreaped would hold a pid of the sandbox's
 * until the command ended). Returns the command's wait status. */
static int reap_until(pid_t command) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid == command) return status;
        if (pid < 0 && errno != EINTR) _exit(125);
    }
}

/* What the command left behind (background children, daemons, a fork bomb) lives on, as on
 * E2B, with us as its subreaper: reaped as it ends, so no zombie holds a pid of the sandbox's.
 * We exit when none is left. Once the command's lifetime (EXPIRES, 0 for none) is over, the
 * agent's RECLAIM takes it all: the agent sends it when the sandbox has no pid left for a new
 * command, so what outlived its lifetime pays for a fork bomb, never a command still in it. */
static void linger(long long expires) {
    sigset_t wake;
    sigemptyset(&wake);
    sigaddset(&wake, SIGCHLD);
    sigaddset(&wake, TREE_KILL);
    sigaddset(&wake, RECLAIM);
    sigprocmask(SIG_BLOCK, &wake, NULL); /* from here on they wait for sigwaitinfo */
    for (;;) {
        if (shepherd_kill) {
            kill_tree();
            return;
        }
        pid_t pid;
        while ((pid = waitpid(-1, NULL, WNOHANG)) > 0) {
        }
        if (pid < 0 && errno == ECHILD) return; /* nothing left */
        int sig = sigwaitinfo(&wake, NULL);
        if (sig == TREE_KILL || (sig == RECLAIM && expires && now_ms() >= expires))
            shepherd_kill = 1;
    }
}

/* The builtin "read" command: the file PATH as the guest's user sees it, for the host's
 * file API where the host must not open it itself (the guest's /proc and /sys are the host
 * kernel's: through a host thread, /proc/self would be the host's). At most READ_MAX bytes
 * to stdout, without blocking on a file that has nothing to give (/proc/kmsg). Returns the
 * exit code: 0, or the errno. */
static int builtin_read(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return errno;
    static char buf[CHUNK];
    size_t total = 0;
    for (;;) {
        ssize_t n = read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno;
        if (n == 0) return 0;
        total += (size_t)n;
        if (total > READ_MAX) return EFBIG;
        for (ssize_t done = 0, w; done < n; done += w)
            if ((w = write(1, buf + done, (size_t)(n - done))) < 0) return errno;
    }
}

/* Tell the agent the command's pid, or -errno when it could not be started (4 bytes). */
static void report_start(int status_fd, int32_t value) {
    char msg[4];
    put_u32(msg, (uint32_t)value);
    if (write(status_fd, msg, 4) != 4) _exit(125);
}

/* The command itself, in the shepherd's child: its session or group, the guest user, its
 * cwd, then the program (or the builtin read). */
static void __attribute__((noreturn)) run_command(const struct launch *l) {
    if (l->use_pty) {
        if (setsid() < 0 || ioctl(0, TIOCSCTTY, 0) != 0) {
            fprintf(stderr, "e2b-exec: controlling terminal: %s\n", strerror(errno));
            _exit(125);
        }
    } else {
        setpgid(0, 0);
    }
    gid_t gid = (gid_t)l->gid;
    if (setgroups(1, &gid) != 0 || setgid(gid) != 0 || setuid((uid_t)l->uid) != 0) {
        fprintf(stderr, "e2b-exec: switch to %ld:%ld: %s\n", l->uid, l->gid, strerror(errno));
        _exit(125);
    }
    /* After setuid (which clears it): if the shepherd is killed, the command dies too. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (chdir(l->cwd) != 0) {
        fprintf(stderr, "e2b-exec: cwd %s: %s\n", l->cwd, strerror(errno));
        _exit(125);
    }
    if (l->builtin) _exit(builtin_read(l->argv[0]));
    execvpe(l->argv[0], l->argv, l->envp);
    fprintf(stderr, "e2b-exec: %s: %s\n", l->argv[0], strerror(errno));
    _exit(127);
}

/* The command's parent inside the guest: the subreaper of everything it starts, so that
 * whatever it leaves behind (even after a setsid) stays under us and the end of its lifetime
 * (TREE_KILL) takes the whole tree while it runs. On STATUS_FD it writes the command's pid
 * once started (report_start) and its wait status (4 bytes) once it ended; then it stays the
 * subreaper of what the command left (linger), and exits as the command did. Its stdio is
 * the command's. */
void shepherd(int status_fd, const struct launch *l) {
    long long expires = l->lifetime > 0 ? now_ms() + l->lifetime : 0;
    prctl(PR_SET_NAME, "e2b-exec");
    set_title("e2b-exec");
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the agent gone: so is the command's tree */
    /* gVisor's kernel (the 2022 runsc Debian ships) has no subreapers: there the command's
     * orphans go to the init, which reaps them, and a lifetime's end kills the command's
     * process group and the children still under it (kill_tree), not those that left. */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0 && errno != EINVAL) _exit(125);
    sigset_t all, none;
    sigfillset(&all);
    sigemptyset(&none);
    sigprocmask(SIG_BLOCK, &all, NULL); /* no signal before the command's pid is known */
    const int forwarded[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};
    for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
        signal(forwarded[i], shepherd_forward);
    signal(TREE_KILL, shepherd_tree_kill);
    signal(RECLAIM, SIG_IGN); /* while the command runs, its lifetime alone rules */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL); /* not the daemon's reaping handler, inherited by fork */
    pid_t command = fork();
    if (command < 0) {
        report_start(status_fd, -errno);
        _exit(125);
    }
    if (command == 0) {
        for (size_t i = 0; i < sizeof forwarded / sizeof forwarded[0]; i++)
            signal(forwarded[i], SIG_DFL);
        signal(TREE_KILL, SIG_DFL);
        signal(RECLAIM, SIG_DFL);
        sigprocmask(SIG_SETMASK, &none, NULL);
        run_command(l);
    }
    if (!l->use_pty) setpgid(command, command); /* no race with the command's own setpgid */
    report_start(status_fd, command);
    shepherd_command = command;
    sigprocmask(SIG_SETMASK, &none, NULL);
    int status = reap_until(command);
    /* Its pid may be reused from now on: no more signals to its group from the handlers. */
    shepherd_command = 0;
    char msg[4];
    put_u32(msg, (uint32_t)status);
    if (write(status_fd, msg, 4) != 4) _exit(125);
    close(status_fd);
    linger(expires);
    if (WIFSIGNALED(status)) {
        signal(WTERMSIG(status), SIG_DFL);
        raise(WTERMSIG(status));
        _exit(128 + WTERMSIG(status));
    }
    _exit(WEXITSTATUS(status));
}
