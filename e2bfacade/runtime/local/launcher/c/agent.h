/* What the guest agent's files share (agent_conn.c states the agent and its wire format):
 * agent_conn.c (the event loop, connections, frames, request dispatch), agent_proc.c (the
 * processes and their output, stdin and ends), agent_shepherd.c (a command's parent in the
 * guest), agent_watch.c (directory watchers). */
#ifndef AGENT_H
#define AGENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

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
    int tcp;       /* over TCP: closed when the host hangs up, never before (conn_flush) */
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

/* What a start request asks for (start() parses it). */
struct launch {
    int use_pty, want_stdin, builtin;
    unsigned cols, rows;
    long uid, gid, lifetime; /* lifetime in ms, 0 for none */
    const char *cwd;
    char **argv, **envp;
};

/* agent_conn.c: the tables, the event loop's registrations, frames and queues. */
extern int ep;
extern struct conn conns[MAX_CONNS];
long long now_ms(void);
void watch(int fd, uint32_t events, int kind, int index);
void unwatch(int fd);
void put_u32(char *p, uint32_t v);
uint32_t get_u32(const char *p);
void queue_push(struct queue *q, const char *data, size_t len);
void queue_free(struct queue *q);
int queue_flush(struct queue *q, int fd);
void send_frame(int i, char type, const char *a, size_t alen, const char *b, size_t blen);
void conn_finish(int i);
void send_u32(int i, char type, uint32_t v);
void send_error(int i, int err, const char *msg);
void send_ack(int i);

/* agent_proc.c: the processes (slots of procs), for connection I's requests. */
extern struct proc procs[MAX_PROCS];
void start(int i, const char *payload, size_t len);
void list_procs(int i);
void proc_request(int i, char type, const char *payload, size_t len);
void proc_resume_if_caught_up(int p);
int read_output(int p, int which);
void stdin_flush(int p);
void read_status(int p);
void on_shepherd_exit(pid_t pid, int status);
/* Lifetimes that ended, and processes ended long enough ago to forget: the time of the next
 * deadline, or NEXT if it is sooner. */
long long procs_tick(long long now, long long next);

/* agent_shepherd.c: in the forked child, with stdio the command's and STATUS_FD the pipe. */
void shepherd(int status_fd, const struct launch *l) __attribute__((noreturn));

/* agent_watch.c */
extern struct watcher watchers[MAX_WATCHERS];
void watch_request(int i, char type, const char *payload, size_t len);
void watch_notify(int i, const char *payload, size_t len);
void watcher_event(int w);
void watchers_drop_follower(int i);

#endif
