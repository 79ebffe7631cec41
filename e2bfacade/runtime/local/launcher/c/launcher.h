/* What the launcher's files share: daemon.c, launch.c, init.c, rootfs.c, seccomp.c (one
 * static binary with the agent's; see sandboxd.h and build.py). */
#ifndef LAUNCHER_H
#define LAUNCHER_H

#include <sys/types.h>

#define MAX_ITEMS 64
#define REQ_MAX 65536
#define MAX_FDS 32     /* mounts handed from the handler to the init */
#define ID_RANGE 65536 /* a sandbox's ids: guest 0..65535 are host BASE..BASE+65535 */

/* A create (or park) request, parsed (launch.c); the strings point into the request. */
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
    const char *volumes[MAX_ITEMS]; /* "SRC:DST": a volume's host mount, writable, at DST */
    int nvolumes;
    const char *leave[MAX_ITEMS];
    int nleave;
};

/* daemon.c */
extern pid_t g_listener; /* the listener process, parent of every handler */

/* launch.c: serve the one request on CONN, in a process forked from the listener. */
void handle_create(int conn) __attribute__((noreturn));
/* One line to the caller, "\n" added. */
void reply(int conn, const char *fmt, ...);

/* init.c: the sandbox's PID 1, with the init's report and the handler's channel. */
extern int report_fd; /* where the init reports "OK" or "ERR <step>: <reason>" */
extern int sync_fd;   /* the init's end of the handler's socket (the mounts come on it) */
void sandbox_init(struct create_req *r) __attribute__((noreturn));
/* Report "ERR STEP: ..." on report_fd and exit: the init failed to start. */
void fail(const char *step, const char *fmt, ...) __attribute__((noreturn));

/* rootfs.c: the guest's file system, built in the sandbox's directory (the working
 * directory) from the mounts the handler made (FDS: NLOWER layers, the binds, lxcfs), ending
 * in the new root with no path back to the host's. */
void build_rootfs(const struct create_req *r, const int *fds, int nlower);
/* After build_rootfs: each volume (R->volumes, their mounts FDS) at its guest path, made and
 * resolved inside the guest's root. */
void mount_volumes(const struct create_req *r, const int *fds);

/* seccomp.c */
int read_seccomp(const char *path);
int apply_seccomp(void);
int run_seccomp_compile(const char *policy, const char *out);

#endif
