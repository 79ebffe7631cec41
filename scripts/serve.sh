#!/usr/bin/env bash
# Set up and serve e2bfacade on http://127.0.0.1:3000 for the unmodified E2B SDKs.
#
# Safe to re-run. On first run it generates SECRET_KEY into .env, creates the team "local"
# and an API key, and saves the raw key in .local-api-key (mode 600, gitignored): keys are
# stored hashed, so the file is the only copy. Later runs reuse that key while it still
# authenticates (delete the file, or revoke the key in the admin, to get a new one).
#
# Environment: WEB_CONCURRENCY (gunicorn workers, default 4) and everything in
# docs/configuration.md.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash scripts/setup.sh

log() { printf '[serve] %s\n' "$*" >&2; }
python=.venv/bin/python

# .env and .local-api-key hold secrets: create them private. The umask is set only in these
# subshells, so that gunicorn and the sandboxes it creates keep the ordinary one.
if ! grep -q '^SECRET_KEY=' .env 2>/dev/null; then
    log "generating SECRET_KEY into .env"
    # token_urlsafe never yields '$', which django-environ would try to interpolate.
    secret="$("$python" -c 'import secrets; print(secrets.token_urlsafe(50))')"
    (umask 077 && echo "SECRET_KEY=$secret" >> .env)
fi

"$python" manage.py migrate --no-input
"$python" manage.py collectstatic --no-input -v0  # admin and /docs assets, served by whitenoise
# The code-interpreter-v1 template (e2b_code_interpreter.Sandbox.create()): built once by the
# template pipeline, in a build sandbox, from wheels and npm packages this host downloads
# (about 700 MB); later runs find a build of the same inputs and do nothing.
if [[ "${SKIP_CODE_INTERPRETER:-0}" != 1 ]]; then
    "$python" manage.py build_code_interpreter
fi

key=""
if [[ -s .local-api-key ]]; then
    key="$(<.local-api-key)"
    # The key travels in the environment, not argv, so it does not show up in `ps`.
    if ! E2BFACADE_KEY="$key" "$python" manage.py shell -c '
import os, sys
from e2bfacade.models import ApiKey
sys.exit(0 if ApiKey.objects.resolve(os.environ["E2BFACADE_KEY"]) else 1)
' >/dev/null 2>&1; then
        log ".local-api-key no longer authenticates (revoked or new database); making a new key"
        key=""
    fi
fi
if [[ -z "$key" ]]; then
    output="$("$python" manage.py create_team local --key-name serve.sh)"
    key="$(printf '%s\n' "$output" | tail -n 1)"
    # create_team's first line names the team; its next one promises the key on the line
    # after it, which serve.sh prints in its export lines instead.
    printf '%s\n' "$output" | head -n 1 >&2
    log "created an API key for it, stored hashed: it is shown once, in the E2B_API_KEY line below"
    (umask 077 && rm -f .local-api-key && printf '%s\n' "$key" > .local-api-key)
fi

workers="${WEB_CONCURRENCY:-4}"
base_url=http://127.0.0.1:3000

# Prometheus multiprocess mode: every gunicorn worker and the lifecycle worker write their
# metrics as files here, and /metrics sums them. Emptied on start (gunicorn.conf.py does it
# too): stale files would be added to this run's counters.
if [[ -z "${PROMETHEUS_MULTIPROC_DIR:-}" ]]; then
    PROMETHEUS_MULTIPROC_DIR="$(mktemp -d -t e2bfacade-metrics.XXXXXX)"
    own_metrics_dir=1
fi
export PROMETHEUS_MULTIPROC_DIR
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"
find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -name '*.db' -delete

sandbox_url=http://127.0.0.1:3001

cat <<MSG

e2bfacade is starting (python manage.py serve: API, data plane and lifecycle worker):
  API           $base_url  ($workers gunicorn workers)
  sandboxes     $sandbox_url  (the data plane: commands, files, ports of every sandbox,
                and the volume content API)
  API docs      $base_url/docs  (schema: $base_url/openapi.json)
  admin         $base_url/admin/  (make a login: .venv/bin/python manage.py createsuperuser)
  health        $base_url/health, readiness $base_url/health/ready
  metrics       $base_url/metrics  (files in $PROMETHEUS_MULTIPROC_DIR)
Logs: one JSON line per API request on stderr. Ctrl-C stops everything (sandboxes and their
commands go on running, and are found again on the next start).

Point the E2B SDK at it:

export E2B_API_URL=$base_url
export E2B_SANDBOX_URL=$sandbox_url
export E2B_VOLUME_API_URL=$sandbox_url
export E2B_API_KEY=$key

MSG

cleanup() {
    if [[ -n "${own_metrics_dir:-}" ]]; then rm -rf "$PROMETHEUS_MULTIPROC_DIR"; fi
}
trap cleanup EXIT
# No gunicorn access log: each request already gets one JSON line (request id, route,
# status, duration, team, idempotency outcome) on stderr.
"$python" manage.py serve --bind 127.0.0.1:3000 --sandbox-bind 127.0.0.1:3001 --workers "$workers"
