#!/usr/bin/env bash
# The whole test suite: the static gates (ruff, ruff format, mypy --strict, no missing
# migration), pytest on PostgreSQL (production's database, where the concurrency guarantees
# are real: every test) and on SQLite (the embedded default: the tests marked
# `both_databases`, of the code that differs per database, and the `sqlite_smoke` of the
# API through a live server; see below), side by side. All must pass.
# Extra arguments select tests and run them on both databases in turn (on SQLite, those of
# them so marked), e.g. `bash scripts/test.sh tests/idempotency -x`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh --tests  # --tests: also the browser test's chromium

log() { printf '[test] %s\n' "$*" >&2; }

# The Debian bases the template tests push to their loopback registry (tests/templates/):
# made once per machine from Debian's mirror (about 2.5 min), taken from the cache after.
# Built beside the first parts of the suite; the template tests wait for them, and fail
# (never skip) when they could not be built.
build_bases() {
    env SECRET_KEY="setup-$RANDOM$RANDOM$RANDOM$RANDOM" \
        .venv/bin/python manage.py seed_registry --build-only >"$1.log" 2>&1
    echo $? >"$1"
}
wait_bases() {
    for _ in $(seq 1200); do
        [[ -s "$1" ]] && break
        sleep 0.5
    done
    if [[ "$(cat "$1" 2>/dev/null)" != 0 ]]; then
        log "the Debian bases could not be built:"
        cat "$1.log" >&2 || true
    fi
}
export E2BFACADE_REQUIRE_TEMPLATE_BASES=1

ensure_postgres() {
    if command -v pg_isready >/dev/null && pg_isready -q -h 127.0.0.1 -p 5432; then
        return
    fi
    if ! command -v pg_ctlcluster >/dev/null || [[ -z "$(ls /etc/postgresql 2>/dev/null)" ]]; then
        log "installing PostgreSQL"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq postgresql >/dev/null
    fi
    local version
    version="$(ls /etc/postgresql | sort -V | tail -n 1)"
    log "starting PostgreSQL $version"
    # Fails harmlessly when the package's postinst already started it.
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 60); do
        pg_isready -q -h 127.0.0.1 -p 5432 && return
        sleep 0.5
    done
    log "PostgreSQL did not come up on 127.0.0.1:5432"
    exit 1
}

ensure_postgres_login() {
    # A fresh Debian cluster trusts only local-socket peers; TCP logins need a password.
    # Give the superuser a known one for this test machine only if we cannot get in already.
    psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1 && return
    export PGPASSWORD=postgres
    psql -h 127.0.0.1 -U postgres -d postgres -Atqc 'select 1' >/dev/null 2>&1 && return
    log "setting a password for the postgres role so that tests can log in over TCP"
    runuser -u postgres -- psql -qc "ALTER ROLE postgres PASSWORD 'postgres'"
}

ensure_postgres
ensure_postgres_login
# No test reaches a real network: sandboxes get the suite's own test internet or nothing.
export SANDBOX_UPLINK=none
# A test that reaches the runtime without a root of its own (an API call asking the host's
# capacity) uses this run's root, shared by the suite's lines as one service's root is,
# never the machine's default (/var/lib/e2bfacade); torn down when the suite ends.
SANDBOX_ROOT="$(mktemp -d /tmp/e2bd-XXXXXX)"
export SANDBOX_ROOT
teardown_run_root() {
    env SECRET_KEY="teardown-$RANDOM$RANDOM$RANDOM$RANDOM" \
        .venv/bin/python manage.py teardown_root >/dev/null 2>&1 || true
    rm -rf "$SANDBOX_ROOT"
}

# Run everything even when something fails, so one run shows all that is broken. Any
# non-zero pytest status fails the suite, including 5 ("no tests collected").
failed=()
logs="$(mktemp -d)"
# A run stopped early stops its parts too.
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$logs"' EXIT

# Static gates: they take seconds. manage.py refuses the built-in SECRET_KEY with DEBUG
# off: give makemigrations a throwaway one (it writes nothing).
gates() {
    local status=0
    log "gate: ruff check"
    .venv/bin/ruff check . || { echo "GATE ruff check" >&2; status=1; }
    log "gate: ruff format"
    .venv/bin/ruff format --check . || { echo "GATE ruff format" >&2; status=1; }
    log "gate: mypy --strict"
    .venv/bin/mypy . || { echo "GATE mypy --strict" >&2; status=1; }
    log "gate: makemigrations --check"
    env SECRET_KEY="gate-$RANDOM$RANDOM$RANDOM$RANDOM" \
        .venv/bin/python manage.py makemigrations --check --dry-run || {
        echo "GATE makemigrations --check" >&2
        status=1
    }
    return "$status"
}

# SQLite: the tests of the code that takes another path there (marked `both_databases`:
# raw SQL, `connection.vendor` branches, advisory locks, LISTEN/NOTIFY; pyproject.toml) and
# a smoke of the API through a live server (`sqlite_smoke`: the SDK's create, pause,
# resume, kill, an idempotent retry, the lifecycle worker's timeout kill). Everything else
# meets the database through the ORM only, the same on both: once, on PostgreSQL.
sqlite_only=(-m "both_databases or sqlite_smoke")
sqlite_url="sqlite:///$logs/e2bfacade-test.sqlite3"

if (($#)); then
    # Arguments select tests: both databases, one after the other, in the foreground.
    build_bases "$logs/bases.status"
    wait_bases "$logs/bases.status"
    gates || failed+=("gates")
    log "pytest on PostgreSQL: $*"
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/e2bfacade .venv/bin/pytest "$@" \
        || failed+=("PostgreSQL (exit $?)")
    log "pytest on SQLite: $*"
    # 5: none of the selected tests is marked for SQLite, which is no failure here.
    status=0
    DATABASE_URL="$sqlite_url" .venv/bin/pytest "${sqlite_only[@]}" "$@" || status=$?
    ((status == 0 || status == 5)) || failed+=("SQLite (exit $status)")
else
    # The whole suite: most of a test's time is spent waiting (for a sandbox to boot, a
    # server to answer, a lease to lapse), so on 2 cores the gates and three lines of pytest
    # run side by side, each pytest in its own process with its own database and sandbox
    # roots (every test makes its own; nothing is shared but the host). The lines are
    # balanced by their measured times (docs/performance.md, "The suite"); SQLite's is the
    # shortest, so the third line runs PostgreSQL's faults, the short soak and the fleet
    # (tests/fleet: its test bed of three hosts) after it.
    # Every line's output is printed whole once it ends.
    pg=postgres://postgres@127.0.0.1:5432
    pg_1=(tests/codeinterpreter tests/network tests/security tests/browser)
    pg_2=(
        tests/api tests/contract tests/fuzz tests/idempotency tests/ops tests/retry
        tests/runtime tests/test_*.py
    )
    pg_3=(tests/faults tests/soak tests/fleet)
    line_3() {
        local status=0
        DATABASE_URL="$sqlite_url" .venv/bin/pytest "${sqlite_only[@]}" tests || status=$?
        DATABASE_URL="$pg/e2bfacade_3" .venv/bin/pytest "${pg_3[@]}" \
            --ignore=tests/faults/test_postgres_restart.py || status=$?
        wait_bases "$logs/bases.status"
        DATABASE_URL="$pg/e2bfacade_3" .venv/bin/pytest tests/templates || status=$?
        return "$status"
    }
    build_bases "$logs/bases.status" &
    declare -A part_pid=()
    run_part() {
        local name="$1"
        shift
        ("$@" >"$logs/${name//[^A-Za-z0-9]/_}.log" 2>&1) &
        part_pid[$name]=$!
    }
    run_part gates gates
    run_part "PostgreSQL 1/3" env DATABASE_URL="$pg/e2bfacade_1" .venv/bin/pytest "${pg_1[@]}"
    run_part "PostgreSQL 2/3" env DATABASE_URL="$pg/e2bfacade_2" .venv/bin/pytest "${pg_2[@]}"
    run_part "SQLite, then PostgreSQL 3/3" line_3
    for name in gates "PostgreSQL 1/3" "PostgreSQL 2/3" "SQLite, then PostgreSQL 3/3"; do
        status=0
        wait "${part_pid[$name]}" || status=$?
        log "---- $name (exit $status)"
        cat "$logs/${name//[^A-Za-z0-9]/_}.log" || true
        ((status == 0)) || failed+=("$name (exit $status)")
    done
    # It restarts the machine's one PostgreSQL cluster: alone, once every other part is done.
    log "pytest on PostgreSQL, alone: a restart of the database server under traffic"
    DATABASE_URL="$pg/e2bfacade_3" E2BFACADE_TEST_PG_RESTART=1 \
        .venv/bin/pytest tests/faults/test_postgres_restart.py \
        || failed+=("PostgreSQL restart (exit $?)")
fi

teardown_run_root
# Nothing the suite made may outlive it: every test root is /tmp/e2b*, and its sandboxes'
# disks, pooled disks, spare launchers and daemons must be gone with it.
leftovers="$(
    grep -c ' /tmp/e2b' /proc/self/mountinfo || true
) mounts, $(
    (losetup -a 2>/dev/null || true) | grep -c '/tmp/e2b' || true
) loop devices, $(
    (pgrep -f '[s]andboxd.* /tmp/e2b|[r]unsc.*--root=/tmp/e2b' || true) | wc -l
) helper processes"
log "left behind under /tmp/e2b*: $leftovers"
if [[ "$leftovers" != "0 mounts, 0 loop devices, 0 helper processes" ]]; then
    failed+=("leftovers ($leftovers)")
fi

if ((${#failed[@]})); then
    log "FAILED on: ${failed[*]}"
    exit 1
fi
log "passed on PostgreSQL and SQLite"
