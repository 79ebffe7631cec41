/* Directory watchers (inotify): followed on their connection ('W') or kept until asked
 * ('N', 'G', 'Q'), recursive ones following new directories as they appear. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/inotify.h>

#include "agent.h"

struct watcher watchers[MAX_WATCHERS];
static int next_watcher_id = 1;
static char watch_roots[MAX_WATCHERS][4096];

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

/* Hand a change of watcher W (NAME relative to its directory) to its follower, or keep it. */
static void watcher_emit(int w, char kind, const char *name) {
    struct watcher *wt = &watchers[w];
    if (wt->kept) {
        if (wt->changes.bytes > (size_t)MAX_KEPT * 64) {
            wt->overflow = 1;
            return;
        }
        char frame[8200];
        size_t nl = strlen(name);
        if (nl > sizeof frame - 6) return;
        put_u32(frame, (uint32_t)(2 + nl));
        frame[4] = 'F', frame[5] = kind;
        memcpy(frame + 6, name, nl);
        queue_push(&wt->changes, frame, 6 + nl);
    } else if (conns[wt->follower].fd > 0) {
        send_frame(wt->follower, 'F', &kind, 1, name, strlen(name));
    }
}

void watcher_event(int w) {
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
            watcher_emit(w, kind, name);
        }
    }
}

/* 'Y' [u8 kind | 0x80 for a directory][absolute path]: a change made from outside the
 * guest's kernel (the host's file operations, under gVisor, whose inotify reports only what
 * the guest itself does), told to every watcher whose directory holds the path, as inotify
 * would have. Answer 'A'. */
void watch_notify(int i, const char *payload, size_t len) {
    if (len < 3 || len > 4096 || (payload[0] & 0x7f) < 1 || (payload[0] & 0x7f) > 5) {
        send_error(i, EINVAL, "bad change");
        return;
    }
    char kind = (char)(payload[0] & 0x7f), path[4097];
    int is_dir = (payload[0] & 0x80) != 0;
    memcpy(path, payload + 1, len - 1);
    path[len - 1] = 0;
    for (int w = 0; w < MAX_WATCHERS; w++) {
        struct watcher *wt = &watchers[w];
        if (!wt->used) continue;
        const char *root = watch_roots[w];
        size_t rl = strcmp(root, "/") ? strlen(root) : 0;
        if (strncmp(path, root, rl) || path[rl] != '/' || !path[rl + 1]) continue;
        const char *rel = path + rl + 1;
        if (!wt->recursive && strchr(rel, '/')) continue;
        if (wt->recursive && is_dir && kind == 1) watch_tree(wt, root, rel);
        watcher_emit(w, kind, rel);
    }
    send_ack(i);
}

static int find_watcher(uint32_t id) {
    for (int w = 0; w < MAX_WATCHERS; w++)
        if (watchers[w].used && watchers[w].kept && (uint32_t)watchers[w].id == id) return w;
    return -1;
}

/* 'W' and 'N' (a new watcher), 'G' and 'Q' (a kept one's changes, its end). */
void watch_request(int i, char type, const char *payload, size_t len) {
    if (type == 'W' || type == 'N') {
        int w = watcher_new(i, payload, len, type == 'W' ? i : -1);
        if (w < 0) return;
        send_u32(i, 'w', (uint32_t)watchers[w].id);
        if (type == 'N') conn_finish(i);
        return;
    }
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

/* Connection I is gone: the watchers that followed it end with it. */
void watchers_drop_follower(int i) {
    for (int w = 0; w < MAX_WATCHERS; w++)
        if (watchers[w].used && watchers[w].follower == i) watcher_free(w);
}
