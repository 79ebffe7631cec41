#!/usr/bin/env bash
# Set up and serve e2bfacade on http://127.0.0.1:3000 for the unmodified E2B SDKs.
#
# Safe to re-run. On first run it generates SECRET_KEY into .env, creates the team "local"
# and an API key, and saves the raw key in .local-api-key (mode 600, gitignored): keys are
# stored hashed, so the file is the only copy. Later runs reuse that key while it still
# authenticates (delete the file, or revoke the key in the admin, to get a new one).
#
# Environment: WEB_CONCURRENCY (gunicorn workers, default 4) and everything in README.md's
# Configuration table.
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
    printf '%s\n' "$output" | sed '$d' >&2  # the human lines; the key is printed below
    key="$(printf '%s\n' "$output" | tail -n 1)"
    (umask 077 && rm -f .local-api-key && printf '%s\n' "$key" > .local-api-key)
fi

workers="${WEB_CONCURRENCY:-4}"
cat <<MSG

e2bfacade is starting on http://127.0.0.1:3000 with $workers workers. Point the E2B SDK at it:

export E2B_API_URL=http://127.0.0.1:3000
export E2B_API_KEY=$key

MSG

# The lifecycle worker (timeouts, abandoned transitions, reconciliation) runs beside
# gunicorn and stops with it: SIGTERM lets each finish what it is doing.
"$python" manage.py run_worker &
worker_pid=$!
echo "lifecycle worker started (pid $worker_pid)" >&2
.venv/bin/gunicorn e2bfacade.wsgi \
    --bind 127.0.0.1:3000 \
    --workers "$workers" \
    --access-logfile - &
gunicorn_pid=$!
trap 'kill -TERM "$gunicorn_pid" "$worker_pid" 2>/dev/null || true' INT TERM EXIT
# Whichever stops first takes the other down with it.
wait -n "$gunicorn_pid" "$worker_pid" || true
