/* What sandboxd.c and agent.c share (one static binary; see build.py). */
#ifndef SANDBOXD_H
#define SANDBOXD_H

/* Overwrite our command line (what /proc/PID/cmdline shows) and the thread's name. */
void set_title(const char *title);

/* Bind and listen on the unix socket PATH (relative to the working directory); -1 on error. */
int agent_listen(const char *path);

/* The guest agent: serves the host on LISTEN_FD (see agent.c). Never returns. */
void agent_main(int listen_fd) __attribute__((noreturn));

#endif
