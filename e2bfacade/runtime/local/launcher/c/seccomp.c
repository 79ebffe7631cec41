/* The guests' seccomp filter: compiled from seccomp.py's policy by `sandboxd
 * seccomp-compile` (libseccomp), read by the handler's maker while its file is reachable, and
 * applied by the sandbox's init, last. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>

#include "launcher.h"

/* A BPF program exported by `sandboxd seccomp-compile`, loaded without no_new_privs: a
 * setuid program in the guest (sudo) must keep working, so the caller must still hold
 * CAP_SYS_ADMIN when it applies it; everything the process starts inherits the filter. */
static struct sock_filter seccomp_prog[4096];
static struct sock_fprog seccomp_fprog;

/* Read the program first (the path may be gone once we are inside the guest's root)... */
int read_seccomp(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, seccomp_prog, sizeof seccomp_prog);
    close(fd);
    if (n <= 0 || n % (ssize_t)sizeof seccomp_prog[0] != 0 || n == (ssize_t)sizeof seccomp_prog) {
        errno = EINVAL;
        return -1;
    }
    seccomp_fprog.len = (unsigned short)(n / (ssize_t)sizeof seccomp_prog[0]);
    seccomp_fprog.filter = seccomp_prog;
    return 0;
}

/* ...then apply it, as late as possible. */
int apply_seccomp(void) {
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &seccomp_fprog);
}

static int parse_cmp(char **tok, struct scmp_arg_cmp *cmp) {
    /* ARG OP VALUE [MASK-DATUM] */
    if (!tok[0] || !tok[1] || !tok[2]) return -1;
    unsigned arg = (unsigned)strtoul(tok[0], NULL, 10);
    unsigned long long a = strtoull(tok[2], NULL, 0), b = tok[3] ? strtoull(tok[3], NULL, 0) : 0;
    enum scmp_compare op;
    if (!strcmp(tok[1], "eq")) op = SCMP_CMP_EQ;
    else if (!strcmp(tok[1], "ne")) op = SCMP_CMP_NE;
    else if (!strcmp(tok[1], "lt")) op = SCMP_CMP_LT;
    else if (!strcmp(tok[1], "le")) op = SCMP_CMP_LE;
    else if (!strcmp(tok[1], "gt")) op = SCMP_CMP_GT;
    else if (!strcmp(tok[1], "ge")) op = SCMP_CMP_GE;
    else if (!strcmp(tok[1], "masked_eq")) op = SCMP_CMP_MASKED_EQ;
    else return -1;
    *cmp = (struct scmp_arg_cmp){.arg = arg, .op = op, .datum_a = a, .datum_b = b};
    return 0;
}

/* Compile a policy (see e2bfacade/runtime/local/seccomp.py) into a BPF program file. */
int run_seccomp_compile(const char *policy, const char *out) {
    FILE *f = fopen(policy, "re");
    if (!f) { perror(policy); return 1; }
    char line[512];
    scmp_filter_ctx ctx = NULL;
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        char *tok[8] = {0};
        int nt = 0;
        for (char *t = strtok(line, " \t\n"); t && nt < 8; t = strtok(NULL, " \t\n")) tok[nt++] = t;
        if (nt == 0) continue;
        if (!strcmp(tok[0], "default") && nt == 3 && !ctx) {
            ctx = seccomp_init(SCMP_ACT_ERRNO((unsigned)atoi(tok[2])));
            if (!ctx) { fprintf(stderr, "seccomp_init failed\n"); return 1; }
            /* No NNP (setuid programs must work); other architectures are killed. */
            seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
            seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
            continue;
        }
        if (!ctx || nt < 2) { rc = -EINVAL; break; }
        int nr = (tok[1][0] >= '0' && tok[1][0] <= '9') ? atoi(tok[1])
                                                         : seccomp_syscall_resolve_name(tok[1]);
        if (nr == __NR_SCMP_ERROR) continue; /* a call this architecture does not have */
        uint32_t action;
        char **cmp_tok;
        if (!strcmp(tok[0], "allow")) { action = SCMP_ACT_ALLOW; cmp_tok = tok + 2; }
        else if (!strcmp(tok[0], "errno") && nt >= 3) {
            action = SCMP_ACT_ERRNO((unsigned)atoi(tok[2]));
            cmp_tok = tok + 3;
        } else { rc = -EINVAL; break; }
        if (cmp_tok[0]) {
            struct scmp_arg_cmp cmp;
            if (parse_cmp(cmp_tok, &cmp) != 0) { rc = -EINVAL; break; }
            rc = seccomp_rule_add_array(ctx, action, nr, 1, &cmp);
        } else {
            rc = seccomp_rule_add_array(ctx, action, nr, 0, NULL);
        }
        if (rc != 0) break;
    }
    fclose(f);
    if (rc != 0 || !ctx) {
        fprintf(stderr, "%s:%d: %s\n", policy, lineno, rc ? strerror(-rc) : "no default line");
        return 1;
    }
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) { perror(out); return 1; }
    rc = seccomp_export_bpf(ctx, fd);
    close(fd);
    seccomp_release(ctx);
    if (rc != 0) { fprintf(stderr, "export: %s\n", strerror(-rc)); return 1; }
    return 0;
}
