"""The ``code-interpreter-v1`` template: what ``e2b_code_interpreter.Sandbox.create()`` starts.

Its image is a layer over ``base`` (so the guest's ``/usr`` is the host's Debian, with its
``python3``) holding ``/opt/e2b-code-interpreter``:

* ``venv/``: a virtual environment of Debian's ``python3`` with the packages of
  ``requirements.txt`` from PyPI (pip's usual index settings and cache apply, so a
  wheelhouse or a mirror works offline: ``PIP_INDEX_URL``, ``PIP_FIND_LINKS``);
* ``server/``: the execution service (``guest/e2b_execution_server.py``, its HTTP side, and
  ``guest/e2b_kernels.py``, the kernels it drives), the template's start command, run as
  ``user``; a create returns once it listens on port 49999; and the JavaScript/TypeScript
  kernel (``guest/e2b_js_kernel.mjs``) it runs on the guest's Node.js;
* ``venv/share/jupyter/kernels/``: the bash kernel's spec, and the R kernel's, which runs
  the guest's (the host's) R with Debian's IRkernel; ``/etc/R``, R's configuration, is the
  host's, copied, since the guest's ``/etc`` is its own;
* ``node/``: the TypeScript compiler that kernel loads (``package-lock.json``, npm);
* ``ipython/``: the kernels' IPython profile (``guest/``): plain tracebacks, the extra
  result formats, the data stack loaded before the first cell;
* ``matplotlib/``: matplotlib's font cache, built here rather than in every sandbox.

The venv is built where it lies on the host and its absolute paths (script shebangs,
bytecode, the font cache) are rewritten to the guest's, so the guest sees one made in place.
Everything is owned by ``user``, so ``pip install`` in a sandbox works without sudo.

The image id carries a digest of the requirements, the npm lock, this file and the guest
files: changing one builds a new image and points the template at it (sandboxes already
running keep theirs).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from e2bfacade.runtime.base import ImageBuild, ImageInfo, Runtime, StartCommand

ALIAS = "code-interpreter-v1"
HERE = Path(__file__).resolve().parent
GUEST_FILES = HERE / "guest"
REQUIREMENTS = HERE / "requirements.txt"
NODE_PACKAGES = (HERE / "package.json", HERE / "package-lock.json")
GUEST_HOME = "/opt/e2b-code-interpreter"
GUEST_PYTHON = f"{GUEST_HOME}/venv/bin/python"
PORT = 49999
GUEST_UID = 1000
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
# cpu, memory and disk of the template row (E2B's code interpreter runs in 2 vCPUs).
CPU_COUNT = 2
MEMORY_MB = 1024
DISK_MB = 2048


class BuildFailed(Exception):
    pass


@dataclass(frozen=True)
class Built:
    image: ImageInfo
    seconds: float
    fresh: bool  # False: the image was there already


def image_id() -> str:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + Path(__file__).read_bytes())
    for path in NODE_PACKAGES:
        digest.update(path.read_bytes())
    for path in sorted(GUEST_FILES.iterdir()):
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    # The image holds a copy of R's configuration: an R upgrade that changes it builds anew.
    for path in sorted(R_CONFIG.glob("*")) if R_CONFIG.is_dir() else ():
        if path.is_file():
            digest.update(b"R/" + path.name.encode() + b"\0" + path.read_bytes())
    return f"code-interpreter-{digest.hexdigest()[:12]}"


def build(runtime: Runtime, *, log: object = None) -> Built:
    """Build the image on ``runtime`` unless it exists; raises BuildFailed with pip's or
    Python's own words when a step fails."""
    wanted = image_id()
    try:
        return Built(runtime.image_info(wanted), 0.0, fresh=False)
    except Exception:  # noqa: BLE001 - ImageNotFound, or any driver's equivalent
        pass
    if not Path(HOST_PYTHON).exists():
        raise BuildFailed(f"{HOST_PYTHON} is missing: install Debian's python3")
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None or not Path(node).resolve().is_relative_to("/usr"):
        # The guest sees the host's /usr only: a node elsewhere would not be in it.
        raise BuildFailed("node and npm under /usr are needed (Debian: apt install nodejs npm)")
    if not (Path(HOST_R).exists() and Path(HOST_IRKERNEL).is_dir() and R_CONFIG.is_dir()):
        raise BuildFailed("R and IRkernel are needed (Debian: apt install r-base r-cran-irkernel)")
    started = time.monotonic()
    info = runtime.build_image(
        ImageBuild(
            image_id=wanted,
            parent="base",
            populate=_populate,
            env=ENV,
            start=StartCommand(
                argv=(GUEST_PYTHON, f"{GUEST_HOME}/server/e2b_execution_server.py"),
                user="user",
                cwd="/home/user",
                env={"E2B_EXECUTION_PORT": str(PORT)},
                ready_port=PORT,
                ready_timeout=90.0,
            ),
        )
    )
    return Built(info, time.monotonic() - started, fresh=True)


def _run(argv: list[str], **kwargs: object) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)  # type: ignore[call-overload]
    if done.returncode != 0:
        said = (done.stderr or done.stdout or "").strip().splitlines()[-15:]
        raise BuildFailed(f"{' '.join(argv[:4])} ... failed:\n" + "\n".join(said))


def _populate(rootfs: Path) -> None:
    home = rootfs / GUEST_HOME.lstrip("/")
    venv = home / "venv"
    home.mkdir(parents=True)
    _run([HOST_PYTHON, "-m", "venv", "--without-pip", str(venv)])
    # This process's pip, run by the venv's interpreter: Debian's python3 needs no
    # python3-venv (ensurepip) for it.
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin/python"),
            "install",
            "--no-input",
            "--disable-pip-version-check",
            "--no-compile",
            "--no-warn-script-location",
            "-r",
            str(REQUIREMENTS),
        ]
    )
    guest_venv = f"{GUEST_HOME}/venv"
    kernels = venv / "share/jupyter/kernels"
    (kernels / "bash").mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [GUEST_PYTHON, "-m", "bash_kernel", "-f", "{connection_file}"],
        "display_name": "Bash",
        "language": "bash",
    }
    (kernels / "bash/kernel.json").write_text(json.dumps(spec))
    # Debian's r-cran-irkernel ships this spec as /usr/share/jupyter/kernels/ir, with a bare
    # "R" found on PATH; the template's own names R by its path and "r" as E2B does.
    (kernels / "r").mkdir()
    spec = {
        "argv": [HOST_R, "--slave", "-e", "IRkernel::main()", "--args", "{connection_file}"],
        "display_name": "R",
        "language": "R",
    }
    (kernels / "r/kernel.json").write_text(json.dumps(spec))
    # R_HOME/etc (Renviron, ldpaths: the library paths R starts with) links to /etc/R.
    shutil.copytree(R_CONFIG, rootfs / "etc/R", symlinks=True)
    # Login shells (commands.run) reset PATH in /etc/profile, which then reads profile.d.
    (rootfs / "etc/profile.d").mkdir(parents=True)
    (rootfs / "etc/profile.d/e2b-code-interpreter.sh").write_text(
        f'export PATH="{GUEST_HOME}/venv/bin:$PATH"\n'
    )
    (home / "server").mkdir()
    # The execution service is its HTTP side and the kernels module it imports from its own
    # directory.
    for name in ("e2b_execution_server.py", "e2b_kernels.py"):
        shutil.copy(GUEST_FILES / name, home / "server")
    # The JavaScript/TypeScript kernel, on the guest's (the host's) Node.js, and the
    # TypeScript compiler it loads, exactly as package-lock.json pins it.
    shutil.copy(GUEST_FILES / "e2b_js_kernel.mjs", home / "server")
    (home / "node").mkdir()
    for path in NODE_PACKAGES:
        shutil.copy(path, home / "node")
    _run(["npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--prefix", str(home / "node")])
    profile = home / "ipython/profile_default"
    (profile / "startup").mkdir(parents=True)
    shutil.copy(GUEST_FILES / "ipython_kernel_config.py", profile)
    shutil.copy(GUEST_FILES / "e2b_startup.py", profile / "startup/00-e2b.py")
    # The font cache, then every absolute path of the build directory made the guest's.
    (home / "matplotlib").mkdir()
    _run(
        [str(venv / "bin/python"), "-c", "import matplotlib.font_manager"],
        env={"MPLCONFIGDIR": str(home / "matplotlib"), "PATH": "/usr/bin:/bin"},
    )
    _relocate(home, str(venv), guest_venv)
    _run(
        [
            str(venv / "bin/python"),
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "-s",
            str(rootfs),
            "-p",
            "/",
            str(venv / "lib"),
            str(home / "server"),
        ]
    )
    for dirpath, dirnames, filenames in os.walk(home):
        for name in (*dirnames, *filenames):
            os.lchown(os.path.join(dirpath, name), GUEST_UID, GUEST_UID)
    os.lchown(home, GUEST_UID, GUEST_UID)


def _relocate(home: Path, built: str, guest: str) -> None:
    """Rewrite ``built`` to ``guest`` in the venv's scripts, its pyvenv.cfg and activate
    scripts, and matplotlib's font cache (no other file records its location)."""
    old, new = built.encode(), guest.encode()
    candidates = [p for p in (home / "venv/bin").iterdir() if p.is_file() and not p.is_symlink()]
    candidates += [home / "venv/pyvenv.cfg", *sorted((home / "matplotlib").glob("*.json"))]
    for path in candidates:
        data = path.read_bytes()
        if old in data:
            path.write_bytes(data.replace(old, new))
