/* What the launcher and the guest agent share (one static binary; see build.py). */
#ifndef SANDBOXD_H
#define SANDBOXD_H

#include <stddef.h>
#include <sys/types.h>

/* Overwrite our command line (what /proc/PID/cmdline shows) and the thread's name. */
void set_title(const char *title);

/* Bind and listen on the unix socket PATH (relative to the working directory); -1 on error. */
int agent_listen(const char *path);

/* Bind and listen on TCP PORT on every address of the guest; -1 on error. */
int agent_listen_tcp(int port);

/* PID 1 of a sandbox that another runtime (gVisor) isolates: the agent on TCP PORT and the
 * orphans' reaper (init.c). Never returns. */
void guest_init(int port) __attribute__((noreturn));

/* The guest agent: serves the host on LISTEN_FD (see agent_conn.c). Never returns. */
void agent_main(int listen_fd) __attribute__((noreturn));

/* Give the sandbox whose init is INIT its veth pair (see net.c); -1 with ERR set on error. */
int net_setup(pid_t init, const char *veth, const char *host_ip, const char *guest_ip, int prefix,
              char *err, size_t err_size);

#endif
