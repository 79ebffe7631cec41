"""What each build step does inside the build sandbox, as E2B's builder does it: the
shell scripts (run as guest root or the step's user, never on the host), the context they
carry from step to step (user, workdir, env), and E2B's hash chain that keys the cache."""

from __future__ import annotations

import hashlib
import re
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

DEFAULT_USER = "user"
PATH_TAIL = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The base's hash inputs (E2B: "v2", its provision version, the disk size, the source).
HASH_VERSION = ("v2", "e2bfacade-1")
GLOB = re.compile(r"[*?\[{]")


class StepFailed(Exception):
    """A step failed; ``message`` is what the SDK shows (E2B's words where it has them)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True)
class Context:
    user: str = "root"
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"user": self.user, "workdir": self.workdir, "env": self.env}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Context:
        data = data or {}
        return cls(
            user=str(data.get("user") or "root"),
            workdir=data.get("workdir"),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        )

    def process_env(self) -> dict[str, str]:
        """The env of a step's process: the context's, with the system's PATH after its."""
        env = dict(self.env)
        if "PATH" in env:
            env["PATH"] = f"{env['PATH']}:{PATH_TAIL}"
        return env


def chain(previous: str, *keys: str) -> str:
    """E2B's ``HashKeys``: sha256 of the previous hash and the keys, ``;``-joined."""
    return hashlib.sha256(";".join((previous, *keys)).encode()).hexdigest()


def step_hash(previous: str, step: dict[str, Any]) -> str:
    return chain(previous, step["type"], " ".join(step["args"]), step.get("filesHash") or "<nil>")


def header(step: dict[str, Any]) -> str:
    return f"{step['type']} {' '.join(step['args'])}".rstrip()


# ------------------------------------------------------------------------------ scripts
def user_script(name: str, *, sudo: bool) -> str:
    """E2B's USER: make the account when missing (with a home from /etc/skel, owned by it);
    ``sudo`` (the default user only) adds passwordless sudo."""
    q = shlex.quote(name)
    lines = [
        "set -e",
        f"if ! id -u {q} >/dev/null 2>&1; then useradd --create-home --shell /bin/bash {q}; fi",
        f'home="$(getent passwd {q} | cut -d: -f6)"',
        'if [ -n "$home" ] && [ -d /etc/skel ] && [ ! -e "$home/.bashrc" ]; then',
        '  mkdir -p "$home"; cp -a /etc/skel/. "$home/"; fi',
        f'if [ -n "$home" ] && [ -d "$home" ]; then chown -R {q}: "$home"; fi',
    ]
    if sudo:
        lines += [
            "for g in sudo wheel admin; do",
            f'  if getent group "$g" >/dev/null; then usermod -aG "$g" {q}; break; fi; done',
            f"passwd -d {q} >/dev/null 2>&1 || true",
            "if [ -d /etc/sudoers.d ]; then",
            f"  echo '{name} ALL=(ALL:ALL) NOPASSWD: ALL' > /etc/sudoers.d/90-e2b-{name}",
            f"  chmod 0440 /etc/sudoers.d/90-e2b-{name}; fi",
        ]
    return "\n".join(lines)


def workdir_script(path: str, owner: str) -> str:
    """E2B's WORKDIR: ``mkdir -p``, what was made owned by the context user; prints the
    directory."""
    q, o = shlex.quote(path), shlex.quote(owner)
    return "\n".join(
        [
            "set -e",
            f'p={q}; d="$p"; first=""',
            'while [ ! -e "$d" ]; do first="$d"; d="$(dirname "$d")"; done',
            'mkdir -p "$p"',
            f'if [ -n "$first" ]; then chown -R {o}: "$first"; fi',
            'cd "$p" && pwd',
        ]
    )


def static_prefix(src: str) -> str:
    """The part of a COPY source before its first glob segment (``folder/*`` → ``folder``)."""
    parts = []
    for part in src.strip("/").split("/"):
        if GLOB.search(part):
            break
        parts.append(part)
    return "/".join(parts) or "."


def copy_script(archive: str, step: dict[str, Any], ctx: Context) -> str:
    """E2B's COPY, run as guest root: unpack the archive (gzip or not) into a temporary
    directory, then move a file or link to ``dest`` (into it when it ends in ``/``) or
    merge a directory's contents into ``dest``; owner and mode first."""
    args = list(step["args"]) + ["", "", "", ""]
    src, dest, owner, mode = args[0], args[1], args[2] or ctx.user, args[3]
    if ":" not in owner:
        owner = f"{owner}:{owner}"
    if mode and not re.fullmatch(r"[0-7]{3,4}", mode):
        raise StepFailed(f"invalid mode '{mode}'")
    base = ctx.workdir or f"~{ctx.user}"
    q = shlex.quote
    return "\n".join(
        [
            "set -e",
            f"archive={q(archive)}",
            'tmp="$(mktemp -d)"',
            'trap \'rm -rf "$tmp" "$archive"\' EXIT',
            'tar -xf "$archive" -C "$tmp" --no-same-owner',
            f'src="$tmp"/{q(static_prefix(src))}',
            'if [ ! -e "$src" ] && [ ! -L "$src" ]; then',
            '  echo "Error: source path does not exist" >&2; exit 1; fi',
            f"cd {base if base.startswith('~') else q(base)}",
            f"dest={q(dest)}",
            f'chown -R -h {q(owner)} "$src"',
            *([f'find "$src" ! -type l -exec chmod {q(mode)} {{}} +'] if mode else []),
            'if [ ! -e "$dest" ]; then made=1; else made=""; fi',
            'if [ -d "$src" ] && [ ! -L "$src" ]; then',
            '  mkdir -p "$dest"',
            f'  if [ -n "$made" ]; then chown {q(owner)} "$dest"; fi',
            '  (cd "$src" && tar -cf - .) | tar -xf - -C "$dest" --keep-directory-symlink'
            " --no-overwrite-dir --same-owner",
            'elif [ "${dest%/}" != "$dest" ]; then',
            '  mkdir -p "$dest"; mv -f "$src" "$dest"',
            "else",
            '  mkdir -p "$(dirname "$dest")"; mv -f "$src" "$dest"',
            "fi",
        ]
    )


def env_script(value: str) -> str:
    """E2B's ENV value expansion: only ``$VAR`` and ``${VAR}`` expand (no commands)."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("`", "\\`").replace("$(", "\\$(")
    )
    return f'printf "%s" "{escaped}"'


def finalize_script(template_id: str, build_id: str) -> str:
    """E2B's configure.sh: ``/.e2b``, the default user with sudo and its home, a world-
    writable ``/usr/local`` and ``/code``."""
    return "\n".join(
        [
            "set -e",
            f"printf 'ENV_ID=%s\\nTEMPLATE_ID=%s\\nBUILD_ID=%s\\n' {template_id} {template_id}"
            f" {build_id} > /.e2b",
            user_script(DEFAULT_USER, sudo=True),
            "chmod -R 777 /usr/local 2>/dev/null || true",
            "mkdir -p /code && chmod 777 /code",
        ]
    )


def with_workdir(ctx: Context, workdir: str) -> Context:
    return replace(ctx, workdir=workdir)
