#!/usr/bin/env bash
# Prepare a machine to run e2bfacade: system packages and .venv from requirements.txt.
#
# Idempotent and fast on re-runs: apt is touched only when a package is missing, and pip only
# when requirements.txt changed since the last successful install (its hash is kept in
# .venv/.requirements.sha256). Run as root on Debian 12 (apt-get needs it).
# `--tests` adds what only the test suite needs (Debian's chromium, for tests/browser/).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf '[setup] %s\n' "$*" >&2; }

# gcc + libc6-dev: the local sandbox runtime compiles its C launcher with `gcc -static`;
# libseccomp-dev: it links libseccomp (static) to build the guests' seccomp filter from the
# Docker-derived default profile in golang-github-containers-common
# (/usr/share/containers/seccomp.json); sudo: the base template shows the host's /usr, and
# its default user has passwordless sudo to guest root, as in E2B's templates;
# e2fsprogs: each sandbox's disk is an ext4 image made with mkfs.ext4.
# nftables (libnftables1) and iproute2: sandbox networking; curl: the network tests' client
# inside sandboxes (the base template's /usr is the host's). nginx-light: the API's front
# (e2bfacade/front.py), which `manage.py serve` starts before gunicorn's sync workers so that
# slow or idle clients cannot hold them (with a configuration of its own, nothing in /etc).
# dante-server: the SOCKS5 server the egressProxy tests run on their test internet
# (tests/support/socks.py; its service is disabled below).
packages=(gcc libc6-dev libseccomp-dev golang-github-containers-common sudo e2fsprogs nftables
    libnftables1 iproute2 curl lxcfs nginx-light dante-server)
# Template bases (templates/builds/): skopeo copies images from a registry, umoci flattens
# them into a root file system and packs the Debian bases that mmdebstrap makes, and
# docker-registry is the registry the tests (and an operator's mirror) serve on loopback.
# Only the programs are wanted: no registry service is started (see below).
packages+=(skopeo umoci docker-registry mmdebstrap)
# node + npm: the JS SDK contract test (tests/contract/test_js_sdk.py). The machines ship
# Node 20; Debian's own nodejs is only the fallback when none is installed.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    packages+=(nodejs npm)
fi
# chromium: the admin's browser test (tests/browser/, driven by playwright-core, which
# downloads no browser of its own). ~350 MB installed, so only for the test suite
# (`setup.sh --tests`, as scripts/test.sh runs it) and only when it is missing: a server
# started by serve.sh never needs it.
if [[ "${1:-}" == "--tests" && ! -x /usr/bin/chromium ]]; then
    packages+=(chromium)
fi
# Programs the runtime tests run inside sandboxes, which see the host's /usr (the base
# template): ps, ip and python3 are not in every minimal Debian.
if [[ "${1:-}" == "--tests" ]]; then
    command -v ps >/dev/null || packages+=(procps)
    [[ -x /usr/bin/ip || -x /usr/sbin/ip ]] || packages+=(iproute2)
    [[ -x /usr/bin/python3 ]] || packages+=(python3)
fi
# The fleet's engines (docs/fleet.md): etcd for membership, HAProxy for the front. Only the
# programs: scripts/fleet.sh runs its own (their services are disabled below); a production
# fleet's units are in docs/fleet.md.
if [[ "${1:-}" == "--tests" || "${1:-}" == "--fleet" ]]; then
    packages+=(etcd-server etcd-client haproxy)
fi
# Debian's python3 at /usr/bin: the code-interpreter-v1 template's Python (its guests see the
# host's /usr; the template's build makes its venv with it). python-is-python3:
# `python` in the base template, as E2B's base template has it.
[[ -x /usr/bin/python3 ]] || packages+=(python3)
packages+=(python-is-python3)
# r-base + r-cran-irkernel: the code-interpreter-v1 template's R kernel, the host's likewise:
# Debian's R with its recommended packages (MASS, Matrix, lattice, survival...), as E2B's
# template has r-base, and IRkernel, from Debian rather than CRAN. 47 packages, 92 MB
# installed, 40 s measured (on a host with python3 and gcc already).
packages+=(r-base r-cran-irkernel)
if ! command -v python3 >/dev/null; then
    packages+=(python3 python3-venv)
elif [[ ! -x .venv/bin/python ]]; then
    # Debian's python3 can create a venv only with python3-venv installed; probe for real
    # rather than guess, since a non-Debian python3 (pyenv, deadsnakes) may not need it.
    probe="$(mktemp -d)"
    if ! python3 -m venv "$probe/venv" >/dev/null 2>&1; then
        packages+=(python3-venv)
    fi
    rm -rf "$probe"
fi

missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    if [[ $EUID -ne 0 ]]; then
        log "missing system packages: ${missing[*]}; run this script as root to install them"
        exit 1
    fi
    log "installing system packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # No package may start a service while it installs (docker-registry's would listen on
    # :5000): invoke-rc.d and deb-systemd-invoke ask policy-rc.d, and 101 means "no". A
    # policy the host has is left as it is; one made here is removed afterwards.
    policy=/usr/sbin/policy-rc.d
    made_policy=""
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
        trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [[ -n $made_policy ]]; then
        rm -f "$policy"
        trap - EXIT
    fi
    # Debian's package enables and starts an nginx service of its own, on port 80 with a
    # welcome page: not one this service wants. A host's own nginx, installed before, is left.
    if [[ " ${missing[*]} " == *" nginx-light "* ]] && command -v systemctl >/dev/null; then
        systemctl disable --now nginx.service >/dev/null 2>&1 || true
    fi
    # The registry's unit is enabled by its package even when policy-rc.d kept it from
    # starting: disabled, so that a reboot does not start it either.
    if [[ " ${missing[*]} " == *" docker-registry "* ]] && command -v systemctl >/dev/null; then
        systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    fi
    # Likewise dante's: the tests run their own danted, in their test internet only.
    if [[ " ${missing[*]} " == *" dante-server "* ]] && command -v systemctl >/dev/null; then
        systemctl disable --now danted.service >/dev/null 2>&1 || true
    fi
    if [[ " ${missing[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null; then
        systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi
    if [[ " ${missing[*]} " == *" haproxy "* ]] && command -v systemctl >/dev/null; then
        systemctl disable --now haproxy.service >/dev/null 2>&1 || true
    fi
fi

# runsc: gVisor, the second sandbox driver (SANDBOX_RUNTIME=gvisor, e2bfacade/runtime/gvisor/),
# whose checkpoint/restore keeps a paused sandbox's memory on disk. Debian 13's build
# (20240729): bookworm's (20221219) cannot checkpoint a sandbox in which any TCP socket is
# watched by epoll ("endpoint still has waiters upon save": the guest agent's, every asyncio
# or Node server's). The package is one static binary with no dependencies; its suite's
# package list is fetched into a directory of its own, so the host's apt sources stay bookworm.
runsc_wanted="0.0~20240729.0-4+b7"
if [[ "$(dpkg-query -W -f='${Version}' runsc 2>/dev/null || true)" != "$runsc_wanted" ]]; then
    if [[ $EUID -ne 0 ]]; then
        log "runsc $runsc_wanted is missing; run this script as root to install it"
        exit 1
    fi
    log "installing runsc $runsc_wanted (gVisor) from Debian 13"
    apt_dir="$(mktemp -d)"
    mkdir -p "$apt_dir/lists/partial"
    # The host's own Debian archive (the first source of its main suite), at suite trixie.
    mirror="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    [[ -n $mirror ]] || mirror="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null || true)"
    if [[ -z $mirror ]]; then
        log "no Debian archive found in the host's apt sources to fetch runsc from"
        exit 1
    fi
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main" \
        >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::sourcelist=$apt_dir/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
    apt-get -qq "${apt_opts[@]}" update
    (cd "$apt_dir" && apt-get -qq "${apt_opts[@]}" download "runsc=$runsc_wanted")
    dpkg -i "$apt_dir"/runsc_*.deb >/dev/null
    rm -rf "$apt_dir"
fi

# A venv whose interpreter no longer runs (python upgraded or removed) is rebuilt.
if [[ -d .venv ]] && ! .venv/bin/python -c '' 2>/dev/null; then
    log "removing broken .venv"
    rm -rf .venv
fi
if [[ ! -d .venv ]]; then
    log "creating .venv"
    python3 -m venv .venv
fi

wanted="$(sha256sum requirements.txt | cut -d' ' -f1)"
if [[ "$(cat .venv/.requirements.sha256 2>/dev/null || true)" != "$wanted" ]]; then
    log "installing requirements.txt into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
    # Written only after pip succeeded, so an interrupted install is retried next time.
    echo "$wanted" > .venv/.requirements.sha256
fi
