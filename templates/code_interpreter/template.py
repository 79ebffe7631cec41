"""The ``code-interpreter-v1`` template: what ``e2b_code_interpreter.Sandbox.create()`` starts.

It is an ordinary template of the build pipeline (``templates/builds/``), defined below with
the E2B Template SDK exactly as a user of the SDK would define it, and built in a build
sandbox. From ``base`` (so the guest's ``/usr`` is the host's Debian, with its ``python3``,
Node.js and R) it makes ``/opt/e2b-code-interpreter``:

* ``venv/``: a virtual environment of Debian's ``python3`` with the packages of
  ``requirements.txt``, pip among them (``pip install`` in a sandbox works without sudo);
* ``server/``: the execution service (``guest/e2b_execution_server.py``, its HTTP side, and
  ``guest/e2b_kernels.py``, the kernels it drives), the template's start command, run as
  ``user``; a create returns once it listens on port 49999; and the JavaScript/TypeScript
  kernel (``guest/e2b_js_kernel.mjs``) it runs on the guest's Node.js;
* ``venv/share/jupyter/kernels/``: the bash kernel's spec, and the R kernel's, which runs
  the guest's (the host's) R with Debian's IRkernel; ``/etc/R``, R's configuration, is the
  host's, copied, since the guest's ``/etc`` is its own;
* ``node/``: the TypeScript compiler that kernel loads (``package-lock.json``);
* ``ipython/``: the kernels' IPython profile (``guest/``): plain tracebacks, the extra
  result formats, the data stack loaded before the first cell;
* ``matplotlib/``: matplotlib's font cache, built here rather than in every sandbox;

and everything under it compiled to bytecode and owned by ``user``.

**Offline.** A build sandbox may have no uplink (``SANDBOX_UPLINK=none``, or
``TEMPLATE_BUILD_INTERNET`` off). So the packages are fetched on the host into the build's
COPY context (:func:`context`): the wheels with ``pip download --only-binary=:all:`` (pip's
index settings apply: ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, a mirror or a wheelhouse) and
the npm packages with ``npm ci --ignore-scripts``: downloads only, nothing is built, run or
installed on the host. The sandbox installs them with ``pip install --no-index``.

**Cached by its inputs.** :func:`inputs_digest` covers the requirements, the npm lock, the
guest files, this definition and ``/etc/R``; the build carries the tag
``inputs-<digest>``, so a second build with the same inputs finds it and does nothing, and
the context is kept by that digest in ``TEMPLATE_CACHE_DIR``, so a new host root reuses the
downloads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from e2b import TemplateClass

ALIAS = "code-interpreter-v1"
HERE = Path(__file__).resolve().parent
GUEST_FILES = HERE / "guest"
REQUIREMENTS = HERE / "requirements.txt"
NODE_PACKAGES = (HERE / "package.json", HERE / "package-lock.json")
GUEST_HOME = "/opt/e2b-code-interpreter"
GUEST_PYTHON = f"{GUEST_HOME}/venv/bin/python"
PORT = 49999
# The host's python3 is the guest's: base shows the host's /usr.
HOST_PYTHON = "/usr/bin/python3"
# R and IRkernel likewise (Debian's r-base and r-cran-irkernel); R_CONFIG is where
# Debian's R keeps what R_HOME/etc links to.
HOST_R = "/usr/bin/R"
HOST_IRKERNEL = "/usr/lib/R/site-library/IRkernel"
R_CONFIG = Path("/etc/R")
ENV = {
    "PATH": f"{GUEST_HOME}/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "VIRTUAL_ENV": f"{GUEST_HOME}/venv",
    "IPYTHONDIR": f"{GUEST_HOME}/ipython",
    "MPLCONFIGDIR": f"{GUEST_HOME}/matplotlib",
    "PYTHONUNBUFFERED": "1",
}
# cpu, memory and disk of the template (E2B's code interpreter runs in 2 vCPUs).
CPU_COUNT = 2
MEMORY_MB = 1024
DISK_MB = 2048
# Where the COPY steps put what the RUN steps install from (gone from the final image).
STAGE = "/var/tmp/e2b-code-interpreter"

# The venv, and the packages installed into it from the wheels alone. pip runs from its own
# wheel (requirements.txt pins it), so neither Debian's pip nor ensurepip is needed; its
# configuration files are ignored, so no host index, constraint or cache applies.
INSTALL = f"""set -eu
mkdir -p {GUEST_HOME}
{HOST_PYTHON} -m venv --without-pip {GUEST_HOME}/venv
set -- {STAGE}/wheels/pip-*.whl
PIP_CONFIG_FILE=/dev/null {GUEST_PYTHON} "$1/pip" install \
--no-index --find-links {STAGE}/wheels --no-input --disable-pip-version-check --no-compile \
--no-warn-script-location --progress-bar off -r {STAGE}/requirements.txt
rm -rf {STAGE}"""

# What is left once every file is in place: the login shells' PATH (/etc/profile resets it,
# then reads profile.d), matplotlib's font cache, the bytecode, the owner.
FINISH = f"""set -eu
mkdir -p /etc/profile.d {GUEST_HOME}/matplotlib
echo 'export PATH="{GUEST_HOME}/venv/bin:$PATH"' > /etc/profile.d/e2b-code-interpreter.sh
MPLCONFIGDIR={GUEST_HOME}/matplotlib {GUEST_PYTHON} -c 'import matplotlib.font_manager'
{GUEST_PYTHON} -m compileall -q -j 0 {GUEST_HOME}/venv/lib {GUEST_HOME}/server
chown -R user:user {GUEST_HOME}"""


class BuildFailed(Exception):
    pass


def definition(context_dir: Path) -> TemplateClass:
    """The template, as the E2B Template SDK defines it, over the files of ``context_dir``
    (made by :func:`context`). Every COPY is a plain tar (``gzip=False``): the archives
    never leave the host, and the wheels are compressed already."""
    from e2b import Template, wait_for_port

    return (
        Template(file_context_path=context_dir)
        .from_template("base")
        .copy("wheels", f"{STAGE}/wheels/", user="root", gzip=False)
        .copy("requirements.txt", f"{STAGE}/requirements.txt", user="root", gzip=False)
        .run_cmd(INSTALL, user="root")
        .copy("R", "/etc/R", user="root", gzip=False)
        .copy("node", f"{GUEST_HOME}/node", user="root", gzip=False)
        .copy("home", GUEST_HOME, user="root", gzip=False)
        .run_cmd(FINISH, user="root")
        .set_envs(ENV)
        .set_workdir("/home/user")
        .set_start_cmd(
            f"{GUEST_PYTHON} {GUEST_HOME}/server/e2b_execution_server.py", wait_for_port(PORT)
        )
    )


def spec(context_dir: Path) -> dict[str, Any]:
    """The trigger's body a Template SDK build of :func:`definition` sends: the steps, each
    COPY with the SDK's own ``filesHash``, the start and ready commands."""
    from e2b import Template

    body: dict[str, Any] = json.loads(Template.to_json(definition(context_dir)))
    return body


def archive(context_dir: Path, src: str) -> Any:
    """A COPY step's archive as the SDK uploads it (a temporary file, at its start)."""
    from e2b.template.utils import read_dockerignore, tar_file_stream

    return tar_file_stream(src, str(context_dir), read_dockerignore(str(context_dir)), False, False)


def check_host() -> None:
    """What the guest uses of the host's ``/usr``: raise BuildFailed naming what is missing."""
    if not Path(HOST_PYTHON).exists():
        raise BuildFailed(f"{HOST_PYTHON} is missing: install Debian's python3")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None or not Path(node).resolve().is_relative_to("/usr"):
        # The guest sees the host's /usr only: a node elsewhere would not be in it.
        raise BuildFailed("node and npm under /usr are needed (Debian: apt install nodejs npm)")
    if not (Path(HOST_R).exists() and Path(HOST_IRKERNEL).is_dir() and R_CONFIG.is_dir()):
        raise BuildFailed("R and IRkernel are needed (Debian: apt install r-base r-cran-irkernel)")


def inputs_digest() -> str:
    """sha256 over everything the image is made of: the requirements, the npm packages and
    lock, the guest files, this definition, and ``/etc/R`` (an R upgrade that changes its
    configuration builds anew)."""
    digest = hashlib.sha256()
    for path in (REQUIREMENTS, *NODE_PACKAGES, Path(__file__)):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for path in sorted(GUEST_FILES.iterdir()):
        if path.is_file():
            digest.update(b"guest/" + path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for path in sorted(R_CONFIG.glob("*")) if R_CONFIG.is_dir() else ():
        if path.is_file():
            digest.update(b"R/" + path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def context(cache_dir: Path, digest: str) -> Path:
    """The build's COPY context for ``digest``, made on the host once and kept in
    ``cache_dir`` (made in a temporary directory beside it and renamed into place: a
    concurrent maker's is the same, and a crash leaves no half of one)."""
    target = cache_dir / digest[:24]
    if target.is_dir():
        return target
    cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(dir=cache_dir, prefix=".making-"))
    try:
        _fill(work)
        try:
            os.rename(work, target)
        except OSError:
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _prune(cache_dir, keep=target)
    return target


def _prune(cache_dir: Path, *, keep: Path) -> None:
    """Remove the contexts of other inputs once an hour old (a build of them that is still
    uploading its archives has had that long): the cache holds about one context."""
    cutoff = time.time() - 3600
    for path in cache_dir.iterdir():
        if path != keep and path.is_dir() and path.stat().st_mtime < cutoff:
            shutil.rmtree(path, ignore_errors=True)


def _fill(ctx: Path) -> None:
    shutil.copy(REQUIREMENTS, ctx / "requirements.txt")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--only-binary=:all:",
            "--python-version",
            _guest_python_version(),
            "--no-input",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--dest",
            str(ctx / "wheels"),
            "-r",
            str(REQUIREMENTS),
        ]
    )
    node = ctx / "node"
    node.mkdir()
    for path in NODE_PACKAGES:
        shutil.copy(path, node)
    # --ignore-scripts: packages are unpacked, nothing of theirs runs on the host.
    _run(
        [
            "npm",
            "ci",
            "--omit=dev",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
            "--prefix",
            str(node),
        ]
    )
    # R_HOME/etc (Renviron, ldpaths: the library paths R starts with) links to /etc/R.
    shutil.copytree(R_CONFIG, ctx / "R", symlinks=True)
    home = ctx / "home"
    server = home / "server"
    server.mkdir(parents=True)
    # The execution service is its HTTP side and the kernels module it imports from its own
    # directory, and the JavaScript/TypeScript kernel it starts on the guest's Node.js.
    for name in ("e2b_execution_server.py", "e2b_kernels.py", "e2b_js_kernel.mjs"):
        shutil.copy(GUEST_FILES / name, server)
    profile = home / "ipython/profile_default"
    (profile / "startup").mkdir(parents=True)
    shutil.copy(GUEST_FILES / "ipython_kernel_config.py", profile)
    shutil.copy(GUEST_FILES / "e2b_startup.py", profile / "startup/00-e2b.py")
    kernels = home / "venv/share/jupyter/kernels"
    _spec(
        kernels / "bash",
        argv=[GUEST_PYTHON, "-m", "bash_kernel", "-f", "{connection_file}"],
        display_name="Bash",
        language="bash",
    )
    # Debian's r-cran-irkernel ships this spec as /usr/share/jupyter/kernels/ir, with a bare
    # "R" found on PATH; the template's own names R by its path and "r" as E2B does.
    _spec(
        kernels / "r",
        argv=[HOST_R, "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"],
        display_name="R",
        language="R",
    )


def _spec(directory: Path, *, argv: list[str], display_name: str, language: str) -> None:
    directory.mkdir(parents=True)
    spec = {"argv": argv, "display_name": display_name, "language": language}
    (directory / "kernel.json").write_text(json.dumps(spec))


def _guest_python_version() -> str:
    """The guest's Python's ``major.minor`` (``/usr/bin/python3`` links to ``python3.11``):
    the wheels are for it, not for this process's interpreter."""
    name = Path(HOST_PYTHON).resolve().name
    version = name.removeprefix("python")
    if name == version or not version.replace(".", "").isdigit():
        raise BuildFailed(f"cannot tell the version of {HOST_PYTHON} (it is {name})")
    return version


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()[-15:]
        raise BuildFailed(f"{' '.join(argv[:4])} ... failed:\n" + "\n".join(said))
