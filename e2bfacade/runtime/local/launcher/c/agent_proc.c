/* The guest's processes, as the agent holds them: a slot per process (started under a
 * shepherd, agent_shepherd.c), its output fanned out to its followers with back-pressure,
 * its stdin queue, its end and the 30 s it is remembered after; the start, connect, input,
 * eof, signal and resize requests. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>

#include "agent.h"

struct proc procs[MAX_PROCS];

static void finish(int p);

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

void proc_resume_if_caught_up(int p) {
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
int read_output(int p, int which) {
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
void read_status(int p) {
    struct proc *pr = &procs[p];
    if (pr->status_fd < 0) return;
    char b[4];
    ssize_t n = read(pr->status_fd, b, sizeof b);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
    close_fd(&pr->status_fd);
    if (n == 4 && !pr->exited) proc_ended(p, (int)get_u32(b));
}

void on_shepherd_exit(pid_t pid, int status) {
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

void stdin_flush(int p) {
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

void start(int i, const char *payload, size_t len) {
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

void list_procs(int i) {
    for (int p = 0; p < MAX_PROCS; p++) {
        if (!procs[p].used || procs[p].exited) continue;
        char b[4];
        put_u32(b, (uint32_t)procs[p].pid);
        send_frame(i, 'L', b, 4, procs[p].config, procs[p].config_len);
    }
    send_ack(i);
}

/* A request about one process: [u32 pid] first. */
void proc_request(int i, char type, const char *payload, size_t len) {
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

long long procs_tick(long long now, long long next) {
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
    return next;
}
