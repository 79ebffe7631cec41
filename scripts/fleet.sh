#!/usr/bin/env bash
# A fleet of e2bfacade hosts on this one machine: the test bed for docs/fleet.md.
#
#   bash scripts/fleet.sh up N          hosts a, b, c… (N between 1 and 4), then the export
#                                       lines to point the E2B SDK at the front; returns
#   bash scripts/fleet.sh kill HOST     the host dies: every process of it killed at once
#   bash scripts/fleet.sh partition HOST   its link cut: it reaches nothing, nothing reaches it
#   bash scripts/fleet.sh heal HOST     its link back
#   bash scripts/fleet.sh restart HOST  its service stopped and started again (a rolling
#                                       restart: its sandboxes go on running)
#   bash scripts/fleet.sh status        what runs, one line per part
#   bash scripts/fleet.sh down          everything it made gone: namespaces, mounts, loop
#                                       devices, rules, processes, the database
#
# Each host is a network namespace with its own address, a mount namespace of its own (so
# its sandboxes' mounts are its own, as on a machine), its own SANDBOX_ROOT and sandbox
# range, an etcd member and the whole service (`manage.py serve`). A hub namespace joins
# them; it holds the fleet's PostgreSQL, reached over TCP so that a partition cuts it. The
# front (HAProxy) runs in the machine's own namespace, on loopback.
#
# FLEET_DIR (default /tmp/e2bfleet) holds its state, so two test beds can coexist: each
# takes a free index, which picks its namespaces' names, its addresses and its ports.
set -Eeuo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
repo="$PWD"

FLEET_DIR="${FLEET_DIR:-/tmp/e2bfleet}"
log() { printf '[fleet] %s\n' "$*" >&2; }
die() {
    log "$*"
    exit 1
}
python="$repo/.venv/bin/python"
pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
HOSTS=(a b c d)

# --- names and addresses of this bed (its index i) --------------------------------------
load() {
    [[ -s "$FLEET_DIR/index" ]] || die "no test bed in $FLEET_DIR (bash scripts/fleet.sh up N)"
    index="$(<"$FLEET_DIR/index")"
    count="$(<"$FLEET_DIR/count")"
    names
}
names() {
    prefix="ef$index"
    hub="${prefix}hub"
    net="10.$((224 + index))"       # the bed's links: hub <-> root, hub <-> each host
    pg_addr="$net.0.2"              # the database, in the hub
    front_port="$((3300 + 10 * index))"
}
host_ns() { echo "$prefix$1"; }
host_num() {
    local i
    for i in "${!HOSTS[@]}"; do [[ "${HOSTS[$i]}" == "$1" ]] && echo "$((i + 1))" && return; done
    die "no host '$1' (hosts are ${HOSTS[*]:0:$count})"
}
host_addr() { echo "$net.$(host_num "$1").2"; }
host_dir() { echo "$FLEET_DIR/hosts/$1"; }
# The host's opaque label (nodes.selectors.host_label of its runtime's host id): its name in
# the front's map and backends, and its node id in the node API.
host_label() { tr -d '\n' <"$(host_dir "$1")/root/host-id" | sha256sum | cut -c1-12; }
# Each host's sandboxes get their own /18, disjoint from the machine's default.
host_cidr() { echo "10.$((232 + index)).$((64 * ($(host_num "$1") - 1))).0/18"; }
# A host's etcd endpoints, its own member first.
etcd_endpoints() {
    local h out="http://$(host_addr "$1"):2379"
    for h in "${HOSTS[@]:0:$count}"; do
        [[ "$h" == "$1" ]] || out+=",http://$(host_addr "$h"):2379"
    done
    echo "$out"
}
# Run a command as part of a host: its network and mount namespaces.
in_host() {
    local h="$1"
    shift
    nsenter --net="/run/netns/$(host_ns "$h")" --mount="$FLEET_DIR/ns/$h.mnt" --wd="$repo" -- "$@"
}

free_index() {
    local i
    for i in $(seq 0 7); do
        ip netns list | grep -q "^ef${i}hub" && continue
        ip -4 route | grep -q "^10\.$((224 + i))\." && continue
        echo "$i"
        return
    done
    die "eight test beds already run on this machine"
}

# --- up -------------------------------------------------------------------------------
link_host() {
    local h="$1" n ns
    n="$(host_num "$h")"
    ns="$(host_ns "$h")"
    ip netns add "$ns"
    ip link add "${prefix}-$h" type veth peer name uplink0 netns "$ns"
    ip link set "${prefix}-$h" netns "$hub"
    ip -n "$hub" addr add "$net.$n.1/24" dev "${prefix}-$h"
    ip -n "$hub" link set "${prefix}-$h" up
    ip -n "$ns" addr add "$net.$n.2/24" dev uplink0
    ip -n "$ns" link set uplink0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" route add default via "$net.$n.1"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
}

# A mount namespace that lives on in a file: sysfs of the host's network namespace, and
# the machine's cgroup hierarchies mounted again under it, as a machine has them.
mount_host() {
    local h="$1" line target fstype opts
    touch "$FLEET_DIR/ns/$h.mnt"
    nsenter --net="/run/netns/$(host_ns "$h")" unshare --mount="$FLEET_DIR/ns/$h.mnt" \
        --propagation private true
    # The machine's /sys, copied into the new namespace, goes first: mount(8) refuses to
    # mount a cgroup hierarchy where the copy says one is already mounted.
    in_host "$h" umount -R -l /sys
    in_host "$h" mount -t sysfs sysfs /sys
    in_host "$h" mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
    while read -r target fstype opts; do
        in_host "$h" mkdir -p "$target"
        in_host "$h" mount -t "$fstype" -o "$opts" "$fstype" "$target"
    done < <(awk '{ for (s = 7; $s != "-"; s++); fs = $(s + 1) }
        fs ~ /^cgroup2?$/ && $5 ~ "^/sys/fs/cgroup/" {
        n = split($(s + 3), o, ","); keep = "";
        for (i = 1; i <= n; i++) if (o[i] != "rw") keep = keep (keep ? "," : "") o[i];
        print $5, fs, (keep ? keep : "defaults") }' /proc/self/mountinfo)
}

start_database() {
    local data="$FLEET_DIR/pg"
    mkdir -p "$data" "$FLEET_DIR/pgsock"
    touch "$FLEET_DIR/pg.log"
    chown postgres: "$data" "$FLEET_DIR/pgsock" "$FLEET_DIR/pg.log"
    runuser -u postgres -- "$pg_bin/initdb" -D "$data" -U postgres --auth=trust >/dev/null
    echo "host all all $net.0.0/16 trust" >>"$data/pg_hba.conf"
    # A vanished client's session (and its advisory locks) is closed after ~10 s of
    # silence, not after the kernel's two hours.
    ip netns exec "$hub" runuser -u postgres -- "$pg_bin/pg_ctl" -D "$data" -s -w \
        -l "$FLEET_DIR/pg.log" -o "-c listen_addresses=$pg_addr -c port=5432 \
        -c unix_socket_directories=$FLEET_DIR/pgsock -c max_connections=300 \
        -c tcp_keepalives_idle=5 -c tcp_keepalives_interval=2 -c tcp_keepalives_count=3" start
    runuser -u postgres -- "$pg_bin/createdb" -h "$FLEET_DIR/pgsock" e2bfacade
}

start_etcd() {
    local h="$1" addr cluster="" g
    addr="$(host_addr "$h")"
    for g in "${HOSTS[@]:0:$count}"; do cluster+="${cluster:+,}$g=http://$(host_addr "$g"):2380"; done
    mkdir -p "$(host_dir "$h")/etcd"
    ip netns exec "$(host_ns "$h")" setsid etcd --name "$h" \
        --data-dir "$(host_dir "$h")/etcd" \
        --listen-client-urls "http://$addr:2379" --advertise-client-urls "http://$addr:2379" \
        --listen-peer-urls "http://$addr:2380" --initial-advertise-peer-urls "http://$addr:2380" \
        --initial-cluster "$cluster" --initial-cluster-state new \
        --initial-cluster-token "$prefix" --pre-vote \
        --heartbeat-interval 100 --election-timeout 1000 \
        >"$(host_dir "$h")/etcd.log" 2>&1 </dev/null &
    echo $! >"$(host_dir "$h")/etcd.pid"
    disown
}

# The environment a host's service runs with: the fleet's database and etcd, its own root.
host_env() {
    local h="$1"
    cat <<ENV
SECRET_KEY=$(<"$FLEET_DIR/secret")
E2BFACADE_ADMIN_TOKEN=$(<"$FLEET_DIR/admin-token")
DATABASE_URL=postgres://postgres@$pg_addr:5432/e2bfacade
SANDBOX_ROOT=$(host_dir "$h")/root
SANDBOX_UPLINK=uplink0
SANDBOX_UPLINK_GATEWAY=$net.$(host_num "$h").1
SANDBOX_NETWORK_CIDR=$(host_cidr "$h")
SANDBOX_INTERNET_DEFAULT=false
ETCD_ENDPOINTS=$(etcd_endpoints "$h")
FLEET_HOST_NAME=$h
FLEET_API_URL=http://$(host_addr "$h"):3000
FLEET_SANDBOX_URL=http://$(host_addr "$h"):3001
PROMETHEUS_MULTIPROC_DIR=$(host_dir "$h")/metrics
SKIP_CODE_INTERPRETER=1
ENV
}

start_host() {
    local h="$1" d
    d="$(host_dir "$h")"
    mkdir -p "$d/root" "$d/metrics"
    find "$d/metrics" -maxdepth 1 -name '*.db' -delete
    host_env "$h" >"$d/env"
    # setsid: the host's processes are one session, which `kill` ends at once.
    # A clean environment: the host runs with its own settings only, not its caller's.
    in_host "$h" env -i PATH="$PATH" LANG=C.UTF-8 $(cat "$d/env") setsid "$python" manage.py serve \
        --bind "$(host_addr "$h"):3000" --sandbox-bind "$(host_addr "$h"):3001" \
        --workers "${FLEET_WORKERS:-2}" --sandbox-workers 1 \
        >>"$d/serve.log" 2>&1 </dev/null &
    echo $! >"$d/serve.pid"
    disown
}

wait_ready() {
    local h="$1" url
    url="http://$(host_addr "$h"):3000/health"
    # Up: its API answers, and its runtime has named its host (the label the front uses).
    for _ in $(seq 600); do
        [[ -s "$(host_dir "$h")/root/host-id" ]] &&
            in_host "$h" curl -fsS -m 1 -o /dev/null "$url" 2>/dev/null && return 0
        kill -0 "$(<"$(host_dir "$h")/serve.pid")" 2>/dev/null || break
        sleep 0.2
    done
    log "host $h did not come up; its log:"
    tail -n 30 "$(host_dir "$h")/serve.log" >&2
    return 1
}

start_front() {
    local h body
    # What the front answers for a host it cannot reach (its health checks failed, or
    # nothing answers): E2B's error shape, and a retry is worth it (the host may come back,
    # or the fleet moves what it held).
    body='{"code":503,"message":"the host that holds this sandbox is unreachable; retry later","error_code":"host_unreachable"}'
    printf 'HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nShould-Retry: true\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s' \
        "${#body}" "$body" >"$FLEET_DIR/503.http"
    # A host that stopped answering in the middle of a request: whether the request took
    # effect is unknown, so no retry is promised (an Idempotency-Key makes one safe).
    body='{"code":502,"message":"the host stopped answering during this request; its outcome is unknown","error_code":"host_unreachable"}'
    printf 'HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\nCache-Control: no-store\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s' \
        "${#body}" "$body" >"$FLEET_DIR/502.http"
    {
        cat <<CFG
global
    stats socket $FLEET_DIR/haproxy.sock mode 600 level admin
    pidfile $FLEET_DIR/haproxy.pid
    maxconn 4096
defaults
    mode http
    timeout connect 3s
    timeout check 1s
    timeout client 1h
    timeout server 1h
    timeout tunnel 1h
    option http-server-close
    errorfile 503 $FLEET_DIR/503.http
    errorfile 502 $FLEET_DIR/502.http
    errorfile 504 $FLEET_DIR/502.http
# The control plane: a sandbox's own routes go to the host that holds it (the map, kept
# from the database by run_front_sync); creates, lists and the rest to any ready host.
frontend api
    bind 127.0.0.1:$front_port
    http-request set-var(txn.sid) path,field(3,/) if { path_beg /sandboxes/ }
    http-request set-var(txn.sid) path,field(4,/) if { path_beg /v2/sandboxes/ }
    use_backend %[var(txn.sid),map($FLEET_DIR/sandboxes.map)]-api if { var(txn.sid),map($FLEET_DIR/sandboxes.map) -m found }
    default_backend any-api
# The data plane: by <port>-<id>.<domain>, or the E2b-Sandbox-Id header the SDKs send.
frontend sandbox
    bind 127.0.0.1:$((front_port + 1))
    http-request set-var(txn.sid) req.hdr(host),field(1,.),field(2,-)
    http-request set-var(txn.sid) req.hdr(e2b-sandbox-id) if { req.hdr(e2b-sandbox-id) -m found }
    use_backend %[var(txn.sid),map($FLEET_DIR/sandboxes.map)]-sandbox if { var(txn.sid),map($FLEET_DIR/sandboxes.map) -m found }
    default_backend any-sandbox
backend any-api
    balance roundrobin
    option httpchk GET /health/placement
CFG
        for h in "${HOSTS[@]:0:$count}"; do
            echo "    server $h $(host_addr "$h"):3000 check inter 1s fall 2 rise 2"
        done
        echo "backend any-sandbox"
        echo "    balance roundrobin"
        echo "    option httpchk GET /health/ready"
        for h in "${HOSTS[@]:0:$count}"; do
            echo "    server $h $(host_addr "$h"):3001 check port 3000 inter 1s fall 2 rise 2"
        done
        # A host's own backends are named by its label (what the map says).
        for h in "${HOSTS[@]:0:$count}"; do
            printf 'backend %s-api\n    option httpchk GET /health/ready\n    server %s %s:3000 check inter 1s fall 2 rise 2\n' \
                "$(host_label "$h")" "$h" "$(host_addr "$h")"
            printf 'backend %s-sandbox\n    option httpchk GET /health/ready\n    server %s %s:3001 check port 3000 inter 1s fall 2 rise 2\n' \
                "$(host_label "$h")" "$h" "$(host_addr "$h")"
        done
    } >"$FLEET_DIR/haproxy.cfg"
    touch "$FLEET_DIR/sandboxes.map"
    haproxy -q -c -f "$FLEET_DIR/haproxy.cfg" || die "the front's configuration is invalid"
    haproxy -D -f "$FLEET_DIR/haproxy.cfg"
    # The map kept from the database (sandboxes/routes.py), from the machine's namespace.
    env $(grep -E '^(SECRET_KEY|DATABASE_URL)=' "$FLEET_DIR/hosts/a/env") setsid "$python" \
        manage.py run_front_sync --socket "$FLEET_DIR/haproxy.sock" \
        --map "$FLEET_DIR/sandboxes.map" >"$FLEET_DIR/front-sync.log" 2>&1 </dev/null &
    echo $! >"$FLEET_DIR/front-sync.pid"
    disown
}

up() {
    local n="${1:-}"
    [[ "$n" =~ ^[1-4]$ ]] || die "usage: fleet.sh up N (N between 1 and 4)"
    [[ $EUID -eq 0 ]] || die "the test bed makes namespaces: run it as root"
    [[ ! -e "$FLEET_DIR/index" ]] || die "a test bed already runs in $FLEET_DIR (fleet.sh down first)"
    command -v etcd >/dev/null && command -v haproxy >/dev/null && [[ -n "$pg_bin" ]] ||
        bash scripts/setup.sh --fleet
    pg_bin="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    mkdir -p "$FLEET_DIR/ns" "$FLEET_DIR/hosts"
    index="$(free_index)"
    count="$n"
    names
    echo "$index" >"$FLEET_DIR/index"
    echo "$count" >"$FLEET_DIR/count"
    "$python" -c 'import secrets; print(secrets.token_urlsafe(50))' >"$FLEET_DIR/secret"
    "$python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$FLEET_DIR/admin-token"
    chmod 600 "$FLEET_DIR/secret" "$FLEET_DIR/admin-token"
    # From here a failure leaves parts behind: `down` removes whatever was made.
    trap 'if ((BASH_SUBSHELL == 0)); then log "up failed: removing what it made"; down; exit 1; fi' ERR

    log "bed $index: hub $hub, links $net.0.0/16, front 127.0.0.1:$front_port"
    ip netns add "$hub"
    ip -n "$hub" link set lo up
    ip netns exec "$hub" sysctl -qw net.ipv4.ip_forward=1
    ip link add "${prefix}-root" type veth peer name root0 netns "$hub"
    ip addr add "$net.0.1/30" dev "${prefix}-root"
    ip link set "${prefix}-root" up
    ip -n "$hub" addr add "$net.0.2/30" dev root0
    ip -n "$hub" link set root0 up
    ip route add "$net.0.0/16" via "$net.0.2"
    mount --bind "$FLEET_DIR/ns" "$FLEET_DIR/ns"
    mount --make-private "$FLEET_DIR/ns"
    local h
    for h in "${HOSTS[@]:0:$count}"; do
        link_host "$h"
        mount_host "$h"
        mkdir -p "$(host_dir "$h")"
    done

    start_database
    for h in "${HOSTS[@]:0:$count}"; do start_etcd "$h"; done
    log "migrating the fleet's database"
    host_env a >"$FLEET_DIR/hosts/a/env"
    in_host a env $(cat "$FLEET_DIR/hosts/a/env") "$python" manage.py migrate --no-input -v0
    for h in "${HOSTS[@]:0:$count}"; do start_host "$h"; done
    for h in "${HOSTS[@]:0:$count}"; do wait_ready "$h"; done
    start_front
    local key
    key="$(in_host a env $(cat "$FLEET_DIR/hosts/a/env") "$python" manage.py create_team fleet \
        --key-name fleet.sh | tail -n 1)"
    trap - ERR
    cat <<MSG

A fleet of $count hosts is up ($FLEET_DIR; \`bash scripts/fleet.sh down\` removes it).
Point the E2B SDK at its front:

export E2B_API_URL=http://127.0.0.1:$front_port
export E2B_SANDBOX_URL=http://127.0.0.1:$((front_port + 1))
export E2B_VOLUME_API_URL=http://127.0.0.1:$((front_port + 1))
export E2B_API_KEY=$key
export E2BFACADE_ADMIN_TOKEN=$(<"$FLEET_DIR/admin-token")

MSG
}

# --- faults ---------------------------------------------------------------------------
kill_host() {
    local h="$1" ns
    ns="$(host_ns "$h")"
    # Every process of the host at once, as a power cut: its service, its etcd member, and
    # whatever runs in its namespaces (its sandboxes' daemons among them).
    local pids
    pids="$(ip netns pids "$ns" 2>/dev/null || true)"
    for f in serve etcd; do
        [[ -s "$(host_dir "$h")/$f.pid" ]] && pids+=" $(<"$(host_dir "$h")/$f.pid")"
    done
    # shellcheck disable=SC2086
    [[ -z "${pids// /}" ]] || kill -9 $pids 2>/dev/null || true
    pkill -9 -f -- "--root=$(host_dir "$h")/root|sandboxd.* $(host_dir "$h")/root" || true
}
partition() { ip -n "$(host_ns "$1")" link set uplink0 down; }
heal() {
    ip -n "$(host_ns "$1")" link set uplink0 up
    ip -n "$(host_ns "$1")" route replace default via "$net.$(host_num "$1").1"
}
restart_host() {
    local h="$1" pid
    pid="$(<"$(host_dir "$h")/serve.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    # A host killed before is started whole: its etcd member too.
    if ! kill -0 "$(<"$(host_dir "$h")/etcd.pid")" 2>/dev/null; then
        start_etcd_again "$h"
    fi
    start_host "$h"
    wait_ready "$h"
}
start_etcd_again() {
    local h="$1" addr
    addr="$(host_addr "$h")"
    ip netns exec "$(host_ns "$h")" setsid etcd --name "$h" \
        --data-dir "$(host_dir "$h")/etcd" \
        --listen-client-urls "http://$addr:2379" --advertise-client-urls "http://$addr:2379" \
        --listen-peer-urls "http://$addr:2380" --initial-advertise-peer-urls "http://$addr:2380" \
        --pre-vote --heartbeat-interval 100 --election-timeout 1000 \
        >>"$(host_dir "$h")/etcd.log" 2>&1 </dev/null &
    echo $! >"$(host_dir "$h")/etcd.pid"
    disown
}

# --- down -----------------------------------------------------------------------------
down() {
    trap - ERR
    set +e
    [[ -s "$FLEET_DIR/index" ]] || { rm -rf "$FLEET_DIR"; return 0; }
    index="$(<"$FLEET_DIR/index")"
    count="$(cat "$FLEET_DIR/count" 2>/dev/null || echo 4)"
    names
    [[ -s "$FLEET_DIR/front-sync.pid" ]] && kill "$(<"$FLEET_DIR/front-sync.pid")" 2>/dev/null
    [[ -s "$FLEET_DIR/haproxy.pid" ]] && kill "$(<"$FLEET_DIR/haproxy.pid")" 2>/dev/null
    local h d
    for h in "${HOSTS[@]:0:$count}"; do
        d="$(host_dir "$h")"
        [[ -s "$d/serve.pid" ]] && kill -TERM "$(<"$d/serve.pid")" 2>/dev/null
    done
    for h in "${HOSTS[@]:0:$count}"; do
        d="$(host_dir "$h")"
        for _ in $(seq 300); do
            [[ -s "$d/serve.pid" ]] && kill -0 "$(<"$d/serve.pid")" 2>/dev/null || break
            sleep 0.1
        done
        # Its sandboxes, pooled disks, daemons and rules: the runtime's own teardown, in
        # the host's namespaces (its mounts are there).
        if [[ -e "$FLEET_DIR/ns/$h.mnt" && -s "$d/env" ]]; then
            in_host "$h" env $(cat "$d/env") "$python" manage.py teardown_root --kill >>"$FLEET_DIR/down.log" 2>&1
        fi
        kill_host "$h"
    done
    if [[ -s "$FLEET_DIR/pg/postmaster.pid" ]]; then
        runuser -u postgres -- "$pg_bin/pg_ctl" -D "$FLEET_DIR/pg" -s -m immediate stop
    fi
    local mnt
    for mnt in "$FLEET_DIR"/ns/*.mnt; do
        mountpoint -q "$mnt" && umount "$mnt"
    done
    for h in "${HOSTS[@]}"; do ip netns del "$(host_ns "$h")" 2>/dev/null; done
    mountpoint -q "$FLEET_DIR/ns" && umount "$FLEET_DIR/ns"
    ip route del "$net.0.0/16" 2>/dev/null
    ip link del "${prefix}-root" 2>/dev/null
    ip netns del "$hub" 2>/dev/null
    rm -rf "$FLEET_DIR"
    set -e
}

status() {
    load
    local h
    printf 'front      127.0.0.1:%s  %s\n' "$front_port" \
        "$(kill -0 "$(<"$FLEET_DIR/haproxy.pid")" 2>/dev/null && echo up || echo down)"
    printf 'database   %s:5432\n' "$pg_addr"
    for h in "${HOSTS[@]:0:$count}"; do
        printf 'host %s     %s  serve %s, etcd %s, link %s\n' "$h" "$(host_addr "$h")" \
            "$(kill -0 "$(<"$(host_dir "$h")/serve.pid")" 2>/dev/null && echo up || echo down)" \
            "$(kill -0 "$(<"$(host_dir "$h")/etcd.pid")" 2>/dev/null && echo up || echo down)" \
            "$(ip -n "$(host_ns "$h")" -br link show uplink0 | awk '{print $2}')"
    done
}

case "${1:-}" in
up) up "${2:-}" ;;
down) down ;;
kill) load && host_num "${2:?host}" >/dev/null && kill_host "$2" ;;
partition) load && host_num "${2:?host}" >/dev/null && partition "$2" ;;
heal) load && host_num "${2:?host}" >/dev/null && heal "$2" ;;
restart) load && host_num "${2:?host}" >/dev/null && restart_host "$2" ;;
status) status ;;
*) die "usage: fleet.sh up N | down | kill HOST | partition HOST | heal HOST | restart HOST | status" ;;
esac
