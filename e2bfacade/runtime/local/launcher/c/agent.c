/*
 * The guest agent: the process inside each sandbox that owns the guest's commands, as
 * envd does inside an E2B microVM. A command's life, its output fan-out, its stdin, its
 * terminal and its lifetime are held here, in the sandbox, so no host process has to stay
 * up for a command to go on: the service can restart and find every command again.
 *
 * It is forked by the sandbox's init after the init has dropped to the guest's root, loaded
 * the guests' seccomp filter, dropped capabilities and made itself non-dumpable, so the agent
 * has exactly a guest root's powers (and cannot be traced or read by the guest). It serves on
 * a unix socket the init bound in the sandbox's host directory before pivot_root: the host
 * reaches it by that path, the guest has no path to it and, non-dumpable, no descriptor.
 *
 * Wire format, both ways: frames of [u32 big-endian length][u8 type][payload], the length
 * counting the type byte and the payload. One request per connection:
 *
 *   'S' start    NUL-terminated items: uid=N gid=N cwd=DIR [pty=COLS,ROWS] [stdin=1]
 *                [lifetime=MS] [tag=T] arg=A... env=K=V...      (the items are the config
 *                List returns). Answer 'P' [u32 pid], then the output (below). With
 *                builtin=read, the command is no program but the agent's read of the file
 *                arg= as the user (builtin_read): its bytes as stdout, its errno as exit code.
 *   'C' connect  [u32 pid]. Answer 'P' [u32 pid], then the output; for a process that
 *                ended in the last 30 s, 'P' then 'X' at once.
 *   'L' list     Answer 'L' [u32 pid][config] per running process, then 'A'.
 *   'I' input    [u32 pid][bytes]       to its stdin (or terminal). Answer 'A'.
 *   'D' eof      [u32 pid]              close its stdin. Answer 'A'.
 *   'K' signal   [u32 pid][u32 signo]   to its process group. Answer 'A'.
 *   'Z' resize   [u32 pid][u16 cols][u16 rows]. Answer 'A'.
 *   'W' watch    [u8 flags][path]   follow a directory's changes on this connection (flags:
 *                1 recursive; the others are kept for the host and handed back by 'G'):
 *                answer 'w' [u32 id], then an 'F' frame per change, until the host hangs up.
 *   'N' watcher  [u8 flags][path]   a watcher that keeps its changes (at most 4096)
 *                until asked: answer 'w' [u32 id].
 *   'G' changes  [u32 id]   'r' [u8 flags][path] first, then the kept changes, oldest first,
 *                as 'F' frames, then 'A'.
 *   'Q' unwatch  [u32 id]   end a kept watcher. Answer 'A'.
 *
 * A change ('F') is [u8 kind][name]: 1 create, 2 write, 3 remove, 4 rename, 5 chmod, with
 * the name relative to the watched directory (inotify's, as envd's fsnotify reports them).
 *
 * Output frames: 'O' stdout, 'R' stderr, 'T' terminal (at most 32 KiB, 16 KiB for a
 * terminal), and last 'X' [u32 wait status] when the command has ended (what it wrote until
 * then has been read; a background child that keeps the pipe open is not waited for, its
 * later output is read and dropped). Errors: 'E' [u32 errno][message].
 *
 * Output goes to every connection following the process (its start and any connects) and is
 * dropped when none does. A follower that falls 1 MiB behind stops the process's output
 * (the pipe fills, the command blocks) until it catches up: the host never buffers for a
 * guest, and neither does the agent beyond that.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include "sandboxd.h"

#define CHUNK 32768
#define PTY_CHUNK 16384
#define MAX_FRAME (1 << 20) /* a request; stdin data comes in pieces of at most this */
#define QUEUE_MAX (1 << 20) /* per follower, and per process's stdin */
#define RETAIN_MS 30000
#define MAX_PROCS 4096
#define MAX_CONNS 1024
#define MAX_ITEMS 4096
#define TREE_KILL (SIGRTMIN + 1)
#define RECLAIM (SIGRTMIN + 2) /* the sandbox is out of pids: see linger() */
#define READ_MAX (1 << 20) /* the builtin read's bound */

enum { K_LISTEN = 1, K_SIGNAL, K_CONN, K_OUT, K_ERR, K_IN, K_WATCH, K_STATUS };

struct chunk {
    struct chunk *next;
    size_t len, off;
    char data[];
};

struct queue {
    struct chunk *head, *tail;
    size_t bytes;
};

struct conn {
    int fd; /* -1: free */
    char *in;
    size_t in_len;
    struct queue out;
    int follows;   /* the process it gets output of, -1 none */
    int closing;   /* close once the queue is written */
    int want_out;  /* EPOLLOUT registered */
    int handled;   /* its one request is being served: later bytes are ignored */
};

struct proc {
    int used;
    pid_t pid, shepherd; /* shepherd 0: reaped (it may outlive the command: linger()) */
    int out, err, in; /* our ends, -1 once closed; with a terminal out is the master */
    int status_fd;    /* where the shepherd tells the command's end, -1 once told */
    int pty, eof_pending, paused, exited, ended, status;
    long long deadline, ended_at;
    struct queue stdin_q;
    char *config;
    size_t config_len;
};

#define MAX_WATCHERS 64
#define MAX_WATCH_DIRS 8192
#define MAX_KEPT 4096

struct watched_dir {
    int wd;
    char *rel; /* "" for the watched directory itself */
};

struct watcher {
    int used, id, fd, recursive, flags, follower, kept, overflow;
    struct watched_dir *dirs;
    int ndirs;
    struct queue changes;
};

static int ep = -1;
static struct watcher watchers[MAX_WATCHERS];
static int next_watcher_id = 1;
static struct conn conns[MAX_CONNS];
static struct proc procs[MAX_PROCS];

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t tag(int kind, int index) { return ((uint64_t)kind << 32) | (uint32_t)index; }

static void watch(int fd, uint32_t events, int kind, int index) {
    struct epoll_event ev = {.events = events, .data.u64 = tag(kind, index)};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

static void unwatch(int fd) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); }

static void put_u32(char *p, uint32_t v) {
    p[0] = (char)(v >> 24), p[1] = (char)(v >> 16), p[2] = (char)(v >> 8), p[3] = (char)v;
}

static uint32_t get_u32(const char *p) {
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

static void queue_push(struct queue *q, const char *data, size_t len) {
    struct chunk *c = malloc(sizeof *c + len);
    if (!c) _exit(70); /* out of the sandbox's own memory: the guest's to fix */
    c->next = NULL, c->len = len, c->off = 0;
    memcpy(c->data, data, len);
    if (q->tail) q->tail->next = c;
    else q->head = c;
    q->tail = c;
    q->bytes += len;
}

static void queue_free(struct queue *q) {
    while (q->head) {
        struct chunk *c = q->head;
        q->head = c->next;
        free(c);
    }
    q->tail = NULL, q->bytes = 0;
}

/* Write what the descriptor takes now; 0 when all is written, 1 when some is left, -1 on
 * an error (the peer is gone). */
static int queue_flush(struct queue *q, int fd) {
    while (q->head) {
        struct chunk *c = q->head;
        ssize_t n = write(fd, c->data + c->off, c->len - c->off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return errno == EAGAIN ? 1 : -1;
        }
        c->off += (size_t)n, q->bytes -= (size_t)n;
        if (c->off < c->len) continue;
        q->head = c->next;
        if (!q->head) q->tail = NULL;
        free(c);
    }
    return 0;
}

static void watcher_free(int w);

static void conn_close(int i) {
    struct conn *c = &conns[i];
    if (c->fd <= 0) return;
    for (int w = 0; w < MAX_WATCHERS; w++)
        if (watchers[w].used && watchers[w].follower == i) watcher_free(w);
    unwatch(c->fd);
    close(c->fd);
    queue_free(&c->out);
    free(c->in);
    memset(c, 0, sizeof *c);
    c->fd = 0; /* free (never a connection: 0..2 are /dev/null) */
    c->follows = -1;
}

static void proc_resume_if_caught_up(int p);
static void finish(int p);

static void conn_flush(int i) {
    struct conn *c = &conns[i];
    int r = queue_flush(&c->out, c->fd);
    if (r < 0) {
        conn_close(i);
        return;
    }
    if (r == 0 && c->closing) {
        conn_close(i);
        return;
    }
    int want = r > 0;
    if (want != c->want_out) {
        watch(c->fd, EPOLLIN | (want ? EPOLLOUT : 0), K_CONN, i);
        c->want_out = want;
    }
    if (c->follows >= 0 && c->out.bytes < QUEUE_MAX / 2) proc_resume_if_caught_up(c->follows);
}

static void send_frame(int i, char type, const char *a, size_t alen, const char *b, size_t blen) {
    struct conn *c = &conns[i];
    if (c->fd <= 0) return;
    char head[5];
    put_u32(head, (uint32_t)(1 + alen + blen));
    head[4] = type;
    char *frame = malloc(5 + alen + blen);
    if (!frame) _exit(70);
    memcpy(frame, head, 5);
    if (alen) memcpy(frame + 5, a, alen);
    if (blen) memcpy(frame + 5 + alen, b, blen);
    queue_push(&c->out, frame, 5 + alen + blen);
    free(frame);
    conn_flush(i);
}

/* The answer is complete: close once it is written. The write just made may have found the
 * host gone and freed the slot already; a freed slot must stay clean, or the connection
 * accepted into it next would be taken for one whose request was answered, and ignored. */
static void conn_finish(int i) {
    if (conns[i].fd <= 0) return;
    conns[i].closing = 1;
    conn_flush(i);
}

static void send_u32(int i, char type, uint32_t v) {
    char b[4];
    put_u32(b, v);
    send_frame(i, type, b, 4, NULL, 0);
}

static void send_error(int i, int err, const char *msg) {
    char b[4];
    put_u32(b, (uint32_t)err);
    send_frame(i, 'E', b, 4, msg, strlen(msg));
    conn_finish(i);
}

static void send_ack(int i) {
    send_frame(i, 'A', NULL, 0, NULL, 0);
    conn_finish(i);
}

/* ------------------------------------------------------------------------ processes */
/* The process PID: a running one first; else, unless LIVE_ONLY, one that ended in the last
 * RETAIN_MS (a late connect gets its end). */
static int find_proc(pid_t pid, int live_only) {
    long long now = now_ms();
    int found = -1;
    for (int p = 0; p < MAX_PROCS; p++) {
        struct proc *pr = &procs[p];
        if (!pr->used || pr->pid != pid) continue;
        if (!pr->exited) return p;
        if (!live_only && pr->ended && now - pr->ended_at <= RETAIN_MS) found = p;
    }
    return found;
}

static void set_output_watch(int p, int on) {
    struct proc *pr = &procs[p];
    if (pr->out >= 0) {
        if (on) watch(pr->out, EPOLLIN, K_OUT, p);
        else unwatch(pr->out);
    }
    if (pr->err >= 0) {
        if (on) watch(pr->err, EPOLLIN, K_ERR, p);
        else unwatch(pr->err);
    }
    pr->paused = !on;
}

static void proc_resume_if_caught_up(int p) {
    if (!procs[p].used || !procs[p].paused) return;
    for (int i = 0; i < MAX_CONNS; i++)
        if (conns[i].fd > 0 && conns[i].follows == p && conns[i].out.bytes >= QUEUE_MAX / 2)
            return;
    set_output_watch(p, 1);
    if (procs[p].exited && !procs[p].ended) finish(p);
}

static void broadcast(int p, char type, const char *data, size_t len) {
    int behind = 0;
    for (int i = 0; i < MAX_CONNS; i++) {
        if (conns[i].fd <= 0 || conns[i].follows != p) continue;
        send_frame(i, type, data, len, NULL, 0);
        if (conns[i].fd > 0 && conns[i].out.bytes >= QUEUE_MAX) behind = 1;
    }
    if (behind && !procs[p].paused) set_output_watch(p, 0);
}

static void close_fd(int *fd) {
    if (*fd >= 0) {
        unwatch(*fd);
        close(*fd);
        *fd = -1;
    }
}

/* Read one chunk of a process's output: 2 when some came, 1 when none is there now, 0 at
 * its end. */
static int read_output(int p, int which) {
    struct proc *pr = &procs[p];
    int *fd = which == K_OUT ? &pr->out : &pr->err;
    if (*fd < 0) return 0;
    static char buf[CHUNK];
    ssize_t n = read(*fd, buf, pr->pty ? PTY_CHUNK : CHUNK);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return 1;
    if (n <= 0) { /* EOF, or EIO from a terminal whose last writer closed */
        if (pr->pty) pr->in = -1; /* the same descriptor */
        close_fd(fd);
        return 0;
    }
    if (!pr->ended) broadcast(p, pr->pty ? 'T' : (which == K_OUT ? 'O' : 'R'), buf, (size_t)n);
    return 2;
}

/* The command has ended and what it wrote before is delivered: tell its followers. Until a
 * follower that fell behind catches up, this waits (the output stays in the pipe). What a
 * background child writes later is read and dropped, so it never gets SIGPIPE. */
static void finish(int p) {
    struct proc *pr = &procs[p];
    for (int which = K_OUT; which <= K_ERR; which++)
        for (int k = 0; k < 64 && read_output(p, which) == 2;)
            if (pr->paused) return; /* resumed later: proc_resume_if_caught_up */
            else k++;
    pr->ended = 1, pr->ended_at = now_ms();
    char b[4];
    put_u32(b, (uint32_t)pr->status);
    for (int i = 0; i < MAX_CONNS; i++) {
        if (conns[i].fd <= 0 || conns[i].follows != p) continue;
        conns[i].follows = -1;
        send_frame(i, 'X', b, 4, NULL, 0);
        conn_finish(i);
    }
    if (!pr->pty) close_fd(&pr->in);
    queue_free(&pr->stdin_q);
}

static void proc_ended(int p, int status) {
    procs[p].exited = 1, procs[p].status = status;
    if (!procs[p].paused) finish(p);
}

/* The shepherd's report of the command's end: its wait status (4 bytes), or nothing when
 * the shepherd died first (then its own exit stands for the command's: on_shepherd_exit). */
static void read_status(int p) {
    struct proc *pr = &procs[p];
    if (pr->status_fd < 0) return;
    char b[4];
    ssize_t n = read(pr->status_fd, b, sizeof b);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close_fd(&pr->status_fd);
    if (n == 4 && !pr->exited) proc_ended(p, (int)get_u32(b));
}

static void on_shepherd_exit(pid_t pid, int status) {
    for (int p = 0; p < MAX_PROCS; p++) {
        struct proc *pr = &procs[p];
        if (!pr->used || pr->shepherd != pid) continue;
        read_status(p); /* a report still in the pipe comes first */
        pr->shepherd = 0;
        if (!pr->exited) proc_ended(p, status);
    }
}

static void proc_free(int p) {
    struct proc *pr = &procs[p];
    close_fd(&pr->err);
    if (pr->pty) pr->in = -1;
    close_fd(&pr->out);
    close_fd(&pr->in);
    close_fd(&pr->status_fd);
    queue_free(&pr->stdin_q);
    free(pr->config);
    memset(pr, 0, sizeof *pr);
    pr->out = pr->err = pr->in = pr->status_fd = -1;
}

static void stdin_flush(int p) {
    struct proc *pr = &procs[p];
    if (pr->in < 0) return;
    int r = queue_flush(&pr->stdin_q, pr->in);
    if (r < 0) { /* the reader is gone */
        queue_free(&pr->stdin_q);
        if (!pr->pty) close_fd(&pr->in);
        return;
    }
    if (r == 0 && pr->eof_pending && !pr->pty) {
        close_fd(&pr->in);
        return;
    }
    if (!pr->pty) {
        if (r > 0) watch(pr->in, EPOLLOUT, K_IN, p);
        else unwatch(pr->in);
    }
}

/* ------------------------------------------------------------------------ shepherd */
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

/* What a start request asks for (start() parses it). */
struct launch {
    int use_pty, want_stdin, builtin;
    unsigned cols, rows;
    long uid, gid, lifetime; /* lifetime in ms, 0 for none */
    const char *cwd;
    char **argv, **envp;
};

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
static void __attribute__((noreturn)) shepherd(int status_fd, const struct launch *l) {
    long long expires = l->lifetime > 0 ? now_ms() + l->lifetime : 0;
    prctl(PR_SET_NAME, "e2b-exec");
    set_title("e2b-exec");
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* the agent gone: so is the command's tree */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0) _exit(125);
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


/* ------------------------------------------------------------------------ watchers */
#define WATCH_MASK                                                                        \
    (IN_CREATE | IN_MOVED_TO | IN_MODIFY | IN_DELETE | IN_MOVED_FROM | IN_ATTRIB |         \
     IN_DELETE_SELF | IN_MOVE_SELF)

static void watcher_free(int w) {
    struct watcher *wt = &watchers[w];
    if (!wt->used) return;
    unwatch(wt->fd);
    close(wt->fd);
    for (int d = 0; d < wt->ndirs; d++) free(wt->dirs[d].rel);
    free(wt->dirs);
    queue_free(&wt->changes);
    memset(wt, 0, sizeof *wt);
}

static int watch_add(struct watcher *wt, const char *root, const char *rel) {
    if (wt->ndirs >= MAX_WATCH_DIRS) return -1;
    char path[8192];
    snprintf(path, sizeof path, "%s%s%s", root, *rel ? "/" : "", rel);
    int wd = inotify_add_watch(wt->fd, path, WATCH_MASK | IN_ONLYDIR | IN_DONT_FOLLOW);
    if (wd < 0) return -1;
    struct watched_dir *grown = realloc(wt->dirs, sizeof *grown * (size_t)(wt->ndirs + 1));
    if (!grown) _exit(70);
    wt->dirs = grown;
    wt->dirs[wt->ndirs].wd = wd;
    wt->dirs[wt->ndirs].rel = strdup(rel);
    if (!wt->dirs[wt->ndirs].rel) _exit(70);
    wt->ndirs++;
    return 0;
}

/* Watch REL and, iteratively, every directory under it (bounded by MAX_WATCH_DIRS). */
static void watch_tree(struct watcher *wt, const char *root, const char *rel) {
    int first = wt->ndirs;
    if (watch_add(wt, root, rel) != 0) return;
    for (int d = first; d < wt->ndirs && wt->ndirs < MAX_WATCH_DIRS; d++) {
        char path[8192];
        snprintf(path, sizeof path, "%s%s%s", root, *wt->dirs[d].rel ? "/" : "", wt->dirs[d].rel);
        DIR *dir = opendir(path);
        if (!dir) continue;
        struct dirent *e;
        while ((e = readdir(dir)) && wt->ndirs < MAX_WATCH_DIRS) {
            if (e->d_type != DT_DIR || !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char child[8192];
            snprintf(child, sizeof child, "%s%s%s", wt->dirs[d].rel, *wt->dirs[d].rel ? "/" : "", e->d_name);
            watch_add(wt, root, child);
        }
        closedir(dir);
    }
}

static char watch_roots[MAX_WATCHERS][4096];

static int watcher_new(int i, const char *payload, size_t len, int follower) {
    if (len < 2 || len > 4096) {
        send_error(i, EINVAL, "bad watch request");
        return -1;
    }
    int w = -1;
    for (int k = 0; k < MAX_WATCHERS && w < 0; k++)
        if (!watchers[k].used) w = k;
    if (w < 0) {
        send_error(i, EAGAIN, "too many watchers in this sandbox");
        return -1;
    }
    struct watcher *wt = &watchers[w];
    memset(wt, 0, sizeof *wt);
    memcpy(watch_roots[w], payload + 1, len - 1);
    watch_roots[w][len - 1] = 0;
    wt->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (wt->fd < 0) {
        send_error(i, errno, "cannot watch: no inotify instance left");
        return -1;
    }
    wt->used = 1, wt->flags = (unsigned char)payload[0], wt->follower = follower;
    wt->recursive = wt->flags & 1;
    wt->kept = follower < 0, wt->id = next_watcher_id++;
    if (wt->recursive) watch_tree(wt, watch_roots[w], "");
    else watch_add(wt, watch_roots[w], "");
    if (wt->ndirs == 0) {
        int err = errno;
        watcher_free(w);
        send_error(i, err, "cannot watch that directory");
        return -1;
    }
    watch(wt->fd, EPOLLIN, K_WATCH, w);
    return w;
}

static void watcher_event(int w) {
    struct watcher *wt = &watchers[w];
    char buf[65536] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(wt->fd, buf, sizeof buf);
        if (n <= 0) return;
        for (char *at = buf; at < buf + n;) {
            struct inotify_event *ev = (struct inotify_event *)at;
            at += sizeof *ev + ev->len;
            const char *rel = NULL;
            for (int d = 0; d < wt->ndirs; d++)
                if (wt->dirs[d].wd == ev->wd) rel = wt->dirs[d].rel;
            if (!rel) continue;
            char name[8192];
            const char *leaf = ev->len ? ev->name : "";
            snprintf(name, sizeof name, "%s%s%s", rel, *rel && *leaf ? "/" : "", leaf);
            char kind = 0;
            if (ev->mask & (IN_CREATE | IN_MOVED_TO)) kind = 1;
            else if (ev->mask & IN_MODIFY) kind = 2;
            else if (ev->mask & (IN_DELETE | IN_DELETE_SELF)) kind = 3;
            else if (ev->mask & (IN_MOVED_FROM | IN_MOVE_SELF)) kind = 4;
            else if (ev->mask & IN_ATTRIB) kind = 5;
            if (!kind || !*name) continue;
            if (wt->recursive && (ev->mask & IN_ISDIR) && kind == 1)
                watch_tree(wt, watch_roots[w], name);
            if (wt->kept) {
                if (wt->changes.bytes > (size_t)MAX_KEPT * 64) {
                    wt->overflow = 1;
                    continue;
                }
                char frame[8200];
                size_t nl = strlen(name);
                put_u32(frame, (uint32_t)(2 + nl));
                frame[4] = 'F', frame[5] = kind;
                memcpy(frame + 6, name, nl);
                queue_push(&wt->changes, frame, 6 + nl);
            } else if (conns[wt->follower].fd > 0) {
                send_frame(wt->follower, 'F', &kind, 1, name, strlen(name));
            }
        }
    }
}

static int find_watcher(uint32_t id) {
    for (int w = 0; w < MAX_WATCHERS; w++)
        if (watchers[w].used && watchers[w].kept && (uint32_t)watchers[w].id == id) return w;
    return -1;
}

/* ----------------------------------------------------------------------- requests */
/* Parse a start request's items (ITEMS, LEN bytes, NUL-terminated each) into L, whose argv
 * and envp point into ITEMS. Returns 0, or -1 when it names no program or no user. */
static int parse_launch(char *items, size_t len, struct launch *l) {
    static char *argv[MAX_ITEMS + 1], *envp[MAX_ITEMS + 1];
    int argc = 0, envc = 0;
    *l = (struct launch){.cols = 80, .rows = 24, .uid = -1, .gid = -1, .cwd = "/"};
    for (size_t off = 0; off < len;) {
        char *item = items + off;
        off += strlen(item) + 1;
        if (!strncmp(item, "arg=", 4) && argc < MAX_ITEMS) argv[argc++] = item + 4;
        else if (!strncmp(item, "env=", 4) && envc < MAX_ITEMS) envp[envc++] = item + 4;
        else if (!strncmp(item, "uid=", 4)) l->uid = strtol(item + 4, NULL, 10);
        else if (!strncmp(item, "gid=", 4)) l->gid = strtol(item + 4, NULL, 10);
        else if (!strncmp(item, "cwd=", 4)) l->cwd = item + 4;
        else if (!strncmp(item, "stdin=", 6)) l->want_stdin = item[6] == '1';
        else if (!strncmp(item, "lifetime=", 9)) l->lifetime = strtol(item + 9, NULL, 10);
        else if (!strcmp(item, "builtin=read")) l->builtin = 1;
        else if (!strncmp(item, "pty=", 4)) {
            l->use_pty = 1;
            if (sscanf(item + 4, "%u,%u", &l->cols, &l->rows) != 2) l->cols = 80, l->rows = 24;
        }
    }
    argv[argc] = NULL, envp[envc] = NULL;
    l->argv = argv, l->envp = envp;
    return argc == 0 || l->uid < 0 || l->gid < 0 ? -1 : 0;
}

/* The sandbox has no pid left for a command: every shepherd is told (RECLAIM), and those
 * whose command's lifetime is over end what the command left (linger). Our children are
 * exactly the shepherds, live or lingering, whether or not a slot still names them. */
static void reclaim_expired(void) {
    static char buf[MAX_PROCS * 12];
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%ld/children", (long)syscall(SYS_gettid));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    size_t n = 0;
    for (ssize_t r; n < sizeof buf - 1 && (r = read(fd, buf + n, sizeof buf - 1 - n)) > 0;)
        n += (size_t)r;
    close(fd);
    buf[n] = 0;
    for (char *tok = strtok(buf, " \n"); tok; tok = strtok(NULL, " \n"))
        kill((pid_t)strtol(tok, NULL, 10), RECLAIM);
}

/* The command's stdio: a terminal (MASTER for us, SLAVE for it) or pipes (OUT, ERR, and IN
 * when it wants stdin). Returns 0, or -1 with errno set. */
static int open_stdio(const struct launch *l, int out[2], int err[2], int in[2], int *master,
                      int *slave) {
    if (!l->use_pty)
        return pipe2(out, O_CLOEXEC) == 0 && pipe2(err, O_CLOEXEC) == 0 &&
                       (!l->want_stdin || pipe2(in, O_CLOEXEC) == 0)
                   ? 0
                   : -1;
    *master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (*master < 0 || grantpt(*master) != 0 || unlockpt(*master) != 0) return -1;
    char *name = ptsname(*master);
    *slave = name ? open(name, O_RDWR | O_NOCTTY | O_CLOEXEC) : -1;
    if (*slave < 0) return -1;
    struct winsize ws = {.ws_row = (unsigned short)l->rows, .ws_col = (unsigned short)l->cols};
    ioctl(*master, TIOCSWINSZ, &ws);
    return 0;
}

static void start(int i, const char *payload, size_t len) {
    char *items = malloc(len + 1);
    if (!items) _exit(70);
    memcpy(items, payload, len);
    items[len] = 0;
    struct launch l;
    int slot = -1;
    for (int p = 0; p < MAX_PROCS && slot < 0; p++)
        if (!procs[p].used) slot = p;
    if (parse_launch(items, len, &l) != 0 || slot < 0) {
        free(items);
        send_error(i, slot < 0 ? EAGAIN : EINVAL, slot < 0 ? "too many processes" : "bad start request");
        return;
    }
    int out[2] = {-1, -1}, err[2] = {-1, -1}, in[2] = {-1, -1}, master = -1, slave = -1;
    int pidpipe[2] = {-1, -1};
    int ok = pipe2(pidpipe, O_CLOEXEC) == 0 && open_stdio(&l, out, err, in, &master, &slave) == 0;
    int saved = ok ? 0 : errno;
    pid_t sh = ok ? fork() : -1;
    if (sh == 0) {
        int fd0 = l.use_pty ? slave : (l.want_stdin ? in[0] : open("/dev/null", O_RDONLY | O_CLOEXEC));
        int fd1 = l.use_pty ? slave : out[1], fd2 = l.use_pty ? slave : err[1];
        if (fd0 < 0 || dup2(fd0, 0) < 0 || dup2(fd1, 1) < 0 || dup2(fd2, 2) < 0) _exit(125);
        if (dup2(pidpipe[1], 3) < 0) _exit(125);
        closefrom(4);
        shepherd(3, &l);
    }
    saved = sh < 0 && ok ? errno : saved;
    close(slave), close(out[1]), close(err[1]), close(in[0]);
    if (pidpipe[1] >= 0) close(pidpipe[1]);
    char pidbuf[4];
    ssize_t got = -1;
    if (sh > 0) /* one write of 4 bytes: read whole, and the status stays in the pipe */
        while ((got = read(pidpipe[0], pidbuf, sizeof pidbuf)) < 0 && errno == EINTR) {
        }
    int32_t pid = got == 4 ? (int32_t)get_u32(pidbuf) : 0;
    if (pid <= 0) {
        close(pidpipe[0]);
        if (sh > 0) {
            kill(sh, SIGKILL);
            waitpid(sh, NULL, 0);
        }
        close(master), close(out[0]), close(err[0]), close(in[1]);
        free(items);
        saved = pid < 0 ? -pid : saved;
        if (saved == EAGAIN) reclaim_expired(); /* so that a retry finds a pid */
        send_error(i, saved ? saved : ECHILD,
                   saved == EAGAIN ? "the sandbox has no process left for the command"
                                   : "cannot start the process");
        return;
    }
    struct proc *pr = &procs[slot];
    memset(pr, 0, sizeof *pr);
    pr->used = 1, pr->pid = pid, pr->shepherd = sh, pr->pty = l.use_pty;
    pr->status_fd = pidpipe[0];
    fcntl(pr->status_fd, F_SETFL, O_NONBLOCK);
    watch(pr->status_fd, EPOLLIN, K_STATUS, slot);
    pr->out = l.use_pty ? master : out[0];
    pr->err = l.use_pty ? -1 : err[0];
    pr->in = l.use_pty ? master : (l.want_stdin ? in[1] : -1);
    for (int *fd = &pr->out; fd <= &pr->in; fd++)
        if (*fd >= 0) fcntl(*fd, F_SETFL, fcntl(*fd, F_GETFL) | O_NONBLOCK);
    pr->deadline = l.lifetime > 0 ? now_ms() + l.lifetime : 0;
    pr->config = items, pr->config_len = len;
    set_output_watch(slot, 1);
    conns[i].follows = slot;
    send_u32(i, 'P', (uint32_t)pid);
}

static void handle_request(int i, char type, const char *payload, size_t len) {
    if (type == 'S') {
        start(i, payload, len);
        return;
    }
    if (type == 'L') {
        for (int p = 0; p < MAX_PROCS; p++) {
            if (!procs[p].used || procs[p].exited) continue;
            char b[4];
            put_u32(b, (uint32_t)procs[p].pid);
            send_frame(i, 'L', b, 4, procs[p].config, procs[p].config_len);
        }
        send_ack(i);
        return;
    }
    if (type == 'W' || type == 'N') {
        int w = watcher_new(i, payload, len, type == 'W' ? i : -1);
        if (w < 0) return;
        send_u32(i, 'w', (uint32_t)watchers[w].id);
        if (type == 'N') conn_finish(i);
        return;
    }
    if ((type == 'G' || type == 'Q') && len >= 4) {
        int w = find_watcher(get_u32(payload));
        if (w < 0) {
            send_error(i, ENOENT, "no such watcher");
            return;
        }
        if (type == 'Q') {
            watcher_free(w);
        } else {
            struct watcher *wt = &watchers[w];
            char flags = (char)wt->flags;
            send_frame(i, 'r', &flags, 1, watch_roots[w], strlen(watch_roots[w]));
            if (conns[i].fd <= 0) return; /* the host is gone: the changes stay kept */
            while (wt->changes.head) { /* hand the kept frames over as they are */
                struct chunk *c = wt->changes.head;
                wt->changes.head = c->next;
                c->next = NULL;
                if (conns[i].out.tail) conns[i].out.tail->next = c;
                else conns[i].out.head = c;
                conns[i].out.tail = c;
                conns[i].out.bytes += c->len;
            }
            wt->changes.tail = NULL, wt->changes.bytes = 0;
            if (wt->overflow) {
                wt->overflow = 0;
                send_error(i, EOVERFLOW, "events were lost: more than the watcher keeps");
                return;
            }
        }
        send_ack(i);
        return;
    }
    if (len < 4) {
        send_error(i, EINVAL, "bad request");
        return;
    }
    pid_t pid = (pid_t)get_u32(payload);
    int p = find_proc(pid, type != 'C');
    if (p < 0) {
        send_error(i, ESRCH, "no such process");
        return;
    }
    struct proc *pr = &procs[p];
    switch (type) {
    case 'C':
        send_u32(i, 'P', (uint32_t)pid);
        if (pr->ended) {
            send_u32(i, 'X', (uint32_t)pr->status);
            conn_finish(i);
        } else {
            conns[i].follows = p;
        }
        return;
    case 'I':
        if (pr->in < 0 || pr->eof_pending) {
            send_error(i, EPIPE, "stdin not enabled or closed");
        } else if (pr->stdin_q.bytes + len - 4 > QUEUE_MAX) {
            send_error(i, EAGAIN, "the process is not reading its stdin");
        } else {
            queue_push(&pr->stdin_q, payload + 4, len - 4);
            stdin_flush(p);
            send_ack(i);
        }
        return;
    case 'D':
        if (pr->pty) {
            send_error(i, ENOTTY, "a terminal has no stdin to close: send Ctrl+D (0x04) instead");
            return;
        }
        pr->eof_pending = 1;
        stdin_flush(p);
        send_ack(i);
        return;
    case 'K':
        if (len < 8) break;
        if (kill(-pid, (int)get_u32(payload + 4)) != 0 && kill(pid, (int)get_u32(payload + 4)) != 0)
            send_error(i, errno, "cannot signal the process");
        else
            send_ack(i);
        return;
    case 'Z':
        if (len < 8) break;
        if (!pr->pty) {
            send_error(i, ENOTTY, "the process has no terminal");
        } else {
            const unsigned char *u = (const unsigned char *)payload + 4;
            struct winsize ws = {.ws_col = (unsigned short)(u[0] << 8 | u[1]),
                                 .ws_row = (unsigned short)(u[2] << 8 | u[3])};
            ioctl(pr->out, TIOCSWINSZ, &ws);
            send_ack(i);
        }
        return;
    }
    send_error(i, EINVAL, "bad request");
}

static void conn_read(int i) {
    struct conn *c = &conns[i];
    char buf[65536];
    ssize_t n = read(c->fd, buf, sizeof buf);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (n <= 0) { /* the host hung up: a follower stops following, the process goes on */
        conn_close(i);
        return;
    }
    if (c->closing || c->handled) return; /* one request per connection */
    if (c->in_len + (size_t)n > MAX_FRAME + 5) {
        send_error(i, E2BIG, "request too large");
        return;
    }
    char *grown = realloc(c->in, c->in_len + (size_t)n);
    if (!grown) _exit(70);
    c->in = grown;
    memcpy(c->in + c->in_len, buf, (size_t)n);
    c->in_len += (size_t)n;
    if (c->in_len < 5) return;
    uint32_t flen = get_u32(c->in);
    if (flen < 1 || flen > MAX_FRAME + 1) {
        send_error(i, EINVAL, "bad frame");
        return;
    }
    if (c->in_len < 4 + (size_t)flen) return;
    c->handled = 1;
    handle_request(i, c->in[4], c->in + 5, flen - 1);
}

int agent_listen(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (fd < 0 || strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    unlink(path);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void agent_main(int listen_fd) {
    set_title("e2b-agent");
    prctl(PR_SET_NAME, "e2b-agent");
    if (dup2(listen_fd, 3) < 0) _exit(1);
    closefrom(4);
    listen_fd = 3;
    fcntl(listen_fd, F_SETFL, O_NONBLOCK);
    signal(SIGPIPE, SIG_IGN);
    signal(SIGCHLD, SIG_DFL); /* the daemon's reaping handler came with the fork */
    sigset_t mask;
    sigemptyset(&mask);
    sigaddset(&mask, SIGCHLD);
    sigprocmask(SIG_BLOCK, &mask, NULL);
    int sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC);
    ep = epoll_create1(EPOLL_CLOEXEC);
    if (sfd < 0 || ep < 0) _exit(1);
    /* The tables stay untouched (zero pages, no memory charged) until used: a free
     * connection has fd 0, a free process slot is not "used". */
    watch(listen_fd, EPOLLIN, K_LISTEN, 0);
    watch(sfd, EPOLLIN, K_SIGNAL, 0);
    for (;;) {
        long long now = now_ms(), next = now + 1000;
        for (int p = 0; p < MAX_PROCS; p++) {
            struct proc *pr = &procs[p];
            if (!pr->used) continue;
            if (!pr->exited && pr->deadline && pr->deadline <= now) {
                kill(pr->shepherd, TREE_KILL); /* the lifetime is over: the whole tree */
                pr->deadline = 0;
            }
            if (!pr->exited && pr->deadline && pr->deadline < next) next = pr->deadline;
            if (pr->ended && now - pr->ended_at > RETAIN_MS && pr->out < 0 && pr->err < 0)
                proc_free(p); /* a lingering shepherd is no longer ours to name */
        }
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, (int)(next - now));
        for (int k = 0; k < n; k++) {
            int kind = (int)(evs[k].data.u64 >> 32), idx = (int)(uint32_t)evs[k].data.u64;
            if (kind == K_LISTEN) {
                for (;;) {
                    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) break;
                    int slot = -1;
                    for (int i = 0; i < MAX_CONNS && slot < 0; i++)
                        if (conns[i].fd <= 0) slot = i;
                    if (slot < 0) {
                        close(fd);
                        continue;
                    }
                    memset(&conns[slot], 0, sizeof conns[slot]);
                    conns[slot].fd = fd;
                    conns[slot].follows = -1;
                    watch(fd, EPOLLIN, K_CONN, slot);
                }
            } else if (kind == K_SIGNAL) {
                struct signalfd_siginfo si;
                while (read(sfd, &si, sizeof si) == sizeof si) {
                }
                int status;
                pid_t pid;
                while ((pid = waitpid(-1, &status, WNOHANG)) > 0) on_shepherd_exit(pid, status);
            } else if (kind == K_CONN) {
                if (conns[idx].fd <= 0) continue;
                if (evs[k].events & EPOLLOUT) conn_flush(idx);
                if (conns[idx].fd > 0 && (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)))
                    conn_read(idx);
            } else if (kind == K_OUT || kind == K_ERR) {
                if (procs[idx].used) read_output(idx, kind);
            } else if (kind == K_IN) {
                if (procs[idx].used) stdin_flush(idx);
            } else if (kind == K_WATCH) {
                if (watchers[idx].used) watcher_event(idx);
            } else if (kind == K_STATUS) {
                if (procs[idx].used) read_status(idx);
            }
        }
    }
}
