#define _GNU_SOURCE
/* A sandbox's link to the host: one veth pair, made by the launcher (host root) once the
 * sandbox's init runs in its own network namespace.
 *
 *   host side  VETH (e.g. e2b1a2b005), address HOSTIP/PREFIX, IPv6 off, strict reverse-path
 *              filtering (a guest cannot send from another sandbox's address), forwarding on
 *   guest side eth0 in the sandbox's namespace, GUESTIP/PREFIX, default route via HOSTIP
 *
 * Only the pair's creation needs rtnetlink (one message, the peer made directly inside the
 * guest's namespace); addresses, flags and the route use the classic ioctls. What the guest
 * may reach through it is decided on the host by nftables (network.py), never here. The
 * pair goes away with the namespace: nothing to undo when the sandbox dies.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <net/route.h>
#include <netinet/in.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sandboxd.h"

#define GUEST_IF "eth0"

struct nlbuf {
    char data[512];
    size_t len;
};

static struct rtattr *nl_put(struct nlbuf *b, unsigned short type, const void *value, size_t size) {
    struct rtattr *a = (struct rtattr *)(b->data + NLMSG_ALIGN(b->len));
    a->rta_type = type;
    a->rta_len = (unsigned short)RTA_LENGTH(size);
    if (size) memcpy(RTA_DATA(a), value, size);
    b->len = NLMSG_ALIGN(b->len) + RTA_ALIGN(a->rta_len);
    return a;
}

static void nl_end(struct nlbuf *b, struct rtattr *nest) {
    nest->rta_len = (unsigned short)(b->data + b->len - (char *)nest);
}

/* One request, its acknowledgement: 0 or -errno. */
static int nl_talk(struct nlbuf *b) {
    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (s < 0) return -errno;
    struct nlmsghdr *h = (struct nlmsghdr *)b->data;
    h->nlmsg_len = (unsigned)b->len;
    struct sockaddr_nl kernel = {.nl_family = AF_NETLINK};
    int rc = -EIO;
    if (sendto(s, b->data, b->len, 0, (struct sockaddr *)&kernel, sizeof kernel) < 0) {
        rc = -errno;
    } else {
        char reply[1024];
        ssize_t n = recv(s, reply, sizeof reply, 0);
        struct nlmsghdr *r = (struct nlmsghdr *)reply;
        if (n >= (ssize_t)NLMSG_LENGTH(sizeof(struct nlmsgerr)) && r->nlmsg_type == NLMSG_ERROR)
            rc = ((struct nlmsgerr *)NLMSG_DATA(r))->error;
    }
    close(s);
    return rc;
}

static int veth_delete(const char *name) {
    struct nlbuf b = {.len = NLMSG_LENGTH(sizeof(struct ifinfomsg))};
    memset(b.data, 0, sizeof b.data);
    struct nlmsghdr *h = (struct nlmsghdr *)b.data;
    h->nlmsg_type = RTM_DELLINK;
    h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    ((struct ifinfomsg *)NLMSG_DATA(h))->ifi_family = AF_UNSPEC;
    nl_put(&b, IFLA_IFNAME, name, strlen(name) + 1);
    return nl_talk(&b);
}

static int veth_create(const char *name, int netns_fd) {
    struct nlbuf b = {.len = NLMSG_LENGTH(sizeof(struct ifinfomsg))};
    memset(b.data, 0, sizeof b.data);
    struct nlmsghdr *h = (struct nlmsghdr *)b.data;
    h->nlmsg_type = RTM_NEWLINK;
    h->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
    ((struct ifinfomsg *)NLMSG_DATA(h))->ifi_family = AF_UNSPEC;
    nl_put(&b, IFLA_IFNAME, name, strlen(name) + 1);
    struct rtattr *info = nl_put(&b, IFLA_LINKINFO, NULL, 0);
    nl_put(&b, IFLA_INFO_KIND, "veth", 4);
    struct rtattr *data = nl_put(&b, IFLA_INFO_DATA, NULL, 0);
    struct rtattr *peer = nl_put(&b, VETH_INFO_PEER, NULL, 0);
    struct ifinfomsg peer_msg = {.ifi_family = AF_UNSPEC};
    memcpy(b.data + b.len, &peer_msg, sizeof peer_msg);
    b.len += NLMSG_ALIGN(sizeof peer_msg);
    nl_put(&b, IFLA_IFNAME, GUEST_IF, sizeof GUEST_IF);
    uint32_t fd = (uint32_t)netns_fd;
    nl_put(&b, IFLA_NET_NS_FD, &fd, sizeof fd);
    nl_end(&b, peer);
    nl_end(&b, data);
    nl_end(&b, info);
    return nl_talk(&b);
}

static int set_ipv4(int s, const char *ifname, unsigned long req, const char *addr) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
    sin->sin_family = AF_INET;
    if (inet_pton(AF_INET, addr, &sin->sin_addr) != 1) return -EINVAL;
    return ioctl(s, req, &ifr) == 0 ? 0 : -errno;
}

static int address_up(int s, const char *ifname, const char *addr, const char *mask) {
    int rc = set_ipv4(s, ifname, SIOCSIFADDR, addr);
    if (!rc) rc = set_ipv4(s, ifname, SIOCSIFNETMASK, mask);
    if (rc) return rc;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof ifr);
    snprintf(ifr.ifr_name, IFNAMSIZ, "%s", ifname);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) != 0) return -errno;
    ifr.ifr_flags |= IFF_UP;
    return ioctl(s, SIOCSIFFLAGS, &ifr) == 0 ? 0 : -errno;
}

static int sysctl_write(const char *fmt, const char *ifname, const char *value) {
    char path[128];
    snprintf(path, sizeof path, fmt, ifname);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    ssize_t n = write(fd, value, strlen(value));
    int rc = n == (ssize_t)strlen(value) ? 0 : -errno;
    close(fd);
    return rc;
}

int net_setup(pid_t init, const char *veth, const char *host_ip, const char *guest_ip, int prefix,
              char *err, size_t err_size) {
    if (strlen(veth) >= IFNAMSIZ || prefix < 8 || prefix > 30) {
        snprintf(err, err_size, "bad link parameters");
        return -1;
    }
    char mask[INET_ADDRSTRLEN];
    struct in_addr m = {.s_addr = htonl(0xffffffffu << (32 - prefix))};
    inet_ntop(AF_INET, &m, mask, sizeof mask);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", init);
    int guest_ns = open(path, O_RDONLY | O_CLOEXEC);
    int host_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    int rc = guest_ns < 0 || host_ns < 0 ? -errno : 0;
    const char *step = "namespace";
    if (!rc) {
        step = "veth";
        rc = veth_create(veth, guest_ns);
        /* A pair of a sandbox that held this slot before may outlive it for a moment (its
         * namespace is torn down by the kernel in the background); the slot is ours now. */
        if (rc == -EEXIST && veth_delete(veth) == 0) rc = veth_create(veth, guest_ns);
    }
    if (!rc) {
        step = "host sysctl";
        rc = sysctl_write("/proc/sys/net/ipv6/conf/%s/disable_ipv6", veth, "1");
        if (!rc) rc = sysctl_write("/proc/sys/net/ipv4/conf/%s/rp_filter", veth, "1");
        if (!rc) rc = sysctl_write("/proc/sys/net/ipv4/conf/%s/forwarding", veth, "1");
    }
    int s = -1;
    if (!rc) {
        step = "host address";
        s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        rc = s < 0 ? -errno : address_up(s, veth, host_ip, mask);
        if (s >= 0) close(s);
        s = -1;
    }
    if (!rc) {
        step = "guest address";
        /* A socket made inside the guest's namespace configures its devices; then back. */
        if (setns(guest_ns, CLONE_NEWNET) != 0) {
            rc = -errno;
        } else {
            s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            if (setns(host_ns, CLONE_NEWNET) != 0) {
                snprintf(err, err_size, "cannot return to the host's network namespace");
                _exit(1); /* never go on in the wrong namespace */
            }
            rc = s < 0 ? -errno : address_up(s, GUEST_IF, guest_ip, mask);
        }
    }
    if (!rc) {
        step = "guest route";
        struct rtentry route;
        memset(&route, 0, sizeof route);
        struct sockaddr_in *gw = (struct sockaddr_in *)&route.rt_gateway;
        gw->sin_family = AF_INET;
        inet_pton(AF_INET, host_ip, &gw->sin_addr);
        ((struct sockaddr_in *)&route.rt_dst)->sin_family = AF_INET;
        ((struct sockaddr_in *)&route.rt_genmask)->sin_family = AF_INET;
        route.rt_flags = RTF_UP | RTF_GATEWAY;
        route.rt_dev = (char *)GUEST_IF;
        rc = ioctl(s, SIOCADDRT, &route) == 0 ? 0 : -errno;
    }
    if (s >= 0) close(s);
    if (guest_ns >= 0) close(guest_ns);
    if (host_ns >= 0) close(host_ns);
    if (rc) snprintf(err, err_size, "%s: %s", step, strerror(-rc));
    return rc ? -1 : 0;
}
