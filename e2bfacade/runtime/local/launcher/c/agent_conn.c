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
 *   'Y' changed  [u8 kind | 0x80 for a directory][path]   a change made outside the guest's
 *                kernel (agent_watch.c): told to the watchers that hold it. Answer 'A'.
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
 *
 * This file holds the event loop, the connections, their queues and frames, and dispatches
 * each request to agent_proc.c (processes) or agent_watch.c (watchers); see agent.h.
 */
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
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/wait.h>
#include <time.h>

#include "agent.h"
#include "sandboxd.h"

int ep = -1;
struct conn conns[MAX_CONNS];

long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static uint64_t tag(int kind, int index) { return ((uint64_t)kind << 32) | (uint32_t)index; }

void watch(int fd, uint32_t events, int kind, int index) {
    struct epoll_event ev = {.events = events, .data.u64 = tag(kind, index)};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
        epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev);
}

void unwatch(int fd) { epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); }

void put_u32(char *p, uint32_t v) {
    p[0] = (char)(v >> 24), p[1] = (char)(v >> 16), p[2] = (char)(v >> 8), p[3] = (char)v;
}

uint32_t get_u32(const char *p) {
    const unsigned char *u = (const unsigned char *)p;
    return (uint32_t)u[0] << 24 | (uint32_t)u[1] << 16 | (uint32_t)u[2] << 8 | u[3];
}

void queue_push(struct queue *q, const char *data, size_t len) {
    struct chunk *c = malloc(sizeof *c + len);
    if (!c) _exit(70); /* out of the sandbox's own memory: the guest's to fix */
    c->next = NULL, c->len = len, c->off = 0;
    memcpy(c->data, data, len);
    if (q->tail) q->tail->next = c;
    else q->head = c;
    q->tail = c;
    q->bytes += len;
}

void queue_free(struct queue *q) {
    while (q->head) {
        struct chunk *c = q->head;
        q->head = c->next;
        free(c);
    }
    q->tail = NULL, q->bytes = 0;
}

/* Write what the descriptor takes now; 0 when all is written, 1 when some is left, -1 on
 * an error (the peer is gone). */
int queue_flush(struct queue *q, int fd) {
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

static void conn_close(int i) {
    struct conn *c = &conns[i];
    if (c->fd <= 0) return;
    watchers_drop_follower(i);
    unwatch(c->fd);
    close(c->fd);
    queue_free(&c->out);
    free(c->in);
    memset(c, 0, sizeof *c);
    c->fd = 0; /* free (never a connection: 0..2 are /dev/null) */
    c->follows = -1;
}

static void conn_flush(int i) {
    struct conn *c = &conns[i];
    int r = queue_flush(&c->out, c->fd);
    if (r < 0) {
        conn_close(i);
        return;
    }
    if (r == 0 && c->closing) {
        /* Over TCP the host hangs up first (conn_read then closes): a guest that closed
         * first would keep a TIME_WAIT endpoint, which gVisor cannot checkpoint. */
        if (c->tcp) {
            if (c->want_out) watch(c->fd, EPOLLIN, K_CONN, i);
            c->want_out = 0;
            return;
        }
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

void send_frame(int i, char type, const char *a, size_t alen, const char *b, size_t blen) {
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
void conn_finish(int i) {
    if (conns[i].fd <= 0) return;
    conns[i].closing = 1;
    conn_flush(i);
}

void send_u32(int i, char type, uint32_t v) {
    char b[4];
    put_u32(b, v);
    send_frame(i, type, b, 4, NULL, 0);
}

void send_error(int i, int err, const char *msg) {
    char b[4];
    put_u32(b, (uint32_t)err);
    send_frame(i, 'E', b, 4, msg, strlen(msg));
    conn_finish(i);
}

void send_ack(int i) {
    send_frame(i, 'A', NULL, 0, NULL, 0);
    conn_finish(i);
}

static void handle_request(int i, char type, const char *payload, size_t len) {
    if (type == 'S') start(i, payload, len);
    else if (type == 'L') list_procs(i);
    else if (type == 'W' || type == 'N') watch_request(i, type, payload, len);
    else if ((type == 'G' || type == 'Q') && len >= 4) watch_request(i, type, payload, len);
    else if (type == 'Y') watch_notify(i, payload, len);
    else proc_request(i, type, payload, len);
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

/* For a sandbox whose host reaches it over its link instead of a unix socket (the gVisor
 * driver): every address of the guest, PORT, bound exclusively (no SO_REUSEADDR): no other
 * socket of the guest, whatever its options, may bind PORT on any address, so no guest user
 * can take the host's connections. (gVisor lets any user bind a port below 1024: a
 * privileged port would add nothing.) Only the host is served: see tcp_conn. */
int agent_listen_tcp(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (fd < 0) return -1;
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 128) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The guest's default gateway (network byte order), from the kernel's routes; 0 for none.
 * It is the host's side of the sandbox's link: an address no guest process can take (it
 * is not the guest's own) nor move (routes need CAP_NET_ADMIN, which no guest process
 * has). Read at each connection, not at start: a restored copy of a sandbox (a fork) runs
 * on another link. */
static uint32_t default_gateway(void) {
    FILE *f = fopen("/proc/net/route", "re");
    char line[256], iface[64];
    unsigned dest, gateway, flags;
    uint32_t found = 0;
    if (!f) return 0;
    while (!found && fgets(line, sizeof line, f))
        if (sscanf(line, "%63s %x %x %x", iface, &dest, &gateway, &flags) == 4 && dest == 0 &&
            (flags & 0x2) /* RTF_GATEWAY */)
            found = gateway; /* /proc shows it in network byte order, as hex */
    fclose(f);
    return found;
}

/* Whether FD is a TCP connection (the gVisor driver's link), with Nagle off for it; -1 for
 * one from anywhere but the host, which is refused: the agent runs commands as any user, so
 * a guest user reaching it would be guest root. The host connects from its side of the
 * link, the guest's default gateway; a guest process has only its own addresses to connect
 * from (binding the gateway's fails even with IP_FREEBIND or IP_TRANSPARENT: measured). */
static int tcp_conn(int fd) {
    struct sockaddr_in local, peer;
    socklen_t len = sizeof local, plen = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &len) != 0 || local.sin_family != AF_INET)
        return 0;
    uint32_t gateway = default_gateway();
    if (getpeername(fd, (struct sockaddr *)&peer, &plen) != 0 || peer.sin_family != AF_INET ||
        gateway == 0 || peer.sin_addr.s_addr != gateway ||
        peer.sin_addr.s_addr == local.sin_addr.s_addr ||
        (ntohl(local.sin_addr.s_addr) >> 24) == 127)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 1;
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
        long long now = now_ms(), next = procs_tick(now, now + 1000);
        struct epoll_event evs[64];
        int n = epoll_wait(ep, evs, 64, (int)(next - now));
        for (int k = 0; k < n; k++) {
            int kind = (int)(evs[k].data.u64 >> 32), idx = (int)(uint32_t)evs[k].data.u64;
            if (kind == K_LISTEN) {
                for (;;) {
                    int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) break;
                    int tcp = tcp_conn(fd);
                    if (tcp < 0) {
                        close(fd);
                        continue;
                    }
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
                    conns[slot].tcp = tcp;
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
