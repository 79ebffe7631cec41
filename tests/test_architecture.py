"""The layering of the apps, checked on the source: e2bfacade is the ground (and
e2bfacade/runtime a Django-free library below it); idempotency and nodes build on it;
templates on those; sandboxes on templates; snapshots on sandboxes. No two apps may import
each other both ways, and the runtime imports nothing of Django or of any app.

nodes is the seam between the API and the hosts (docs/ARCHITECTURE.md, "Nodes: where a
fleet layer sits"): above the ground, only it reaches the process's runtime registry
(``e2bfacade.sandbox_runtime``, ``e2bfacade.runtime.registry``) and only it compares a row's
host with a node's.

Every ``import`` and ``from ... import`` statement counts, at module level or inside a
function (a function-level import is still a dependency, only a later one). References by
string (``apps.get_model("sandboxes.Sandbox")``, ``include("sandboxes.urls")``, a related
name) are how a lower app names a higher one without importing it, and are not counted.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("e2bfacade", "idempotency", "nodes", "sandboxes", "snapshots", "templates")
# The lifecycle worker drives every app's periodic work by nature; it may import any app.
EXEMPT = {Path("sandboxes/management/commands/run_worker.py")}
RUNTIME = Path("e2bfacade/runtime")
# What the runtime library must not import: Django and its ecosystem, and every app. Of
# e2bfacade itself only e2bfacade.runtime is allowed.
NOT_FOR_RUNTIME = (
    "django",
    "rest_framework",
    "drf_spectacular",
    "environ",
    "idempotency",
    "sandboxes",
    "snapshots",
    "templates",
)


def _sources(directory: Path, *, exempt: set[Path] = EXEMPT) -> Iterator[Path]:
    """The Python files under ``directory`` (relative to the repository), migrations and
    the ``exempt`` ones (the worker, for the layers) left out."""
    for path in sorted((ROOT / directory).rglob("*.py")):
        relative = path.relative_to(ROOT)
        if "migrations" in relative.parts or relative in exempt:
            continue
        yield relative


def _imports(relative: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of everything ``relative`` imports. ``from a.b import c`` yields
    ``a.b.c`` (c may be a module or a name: either way it comes from a.b); relative imports
    are resolved against the file's own package."""
    tree = ast.parse((ROOT / relative).read_text(), filename=str(relative))
    package = list(relative.parent.parts)  # of a.py and of __init__.py alike
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package[: len(package) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def _app_dependencies() -> dict[tuple[str, str], list[str]]:
    """(importing app, imported app) -> the statements behind that edge."""
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for app in APPS:
        for relative in _sources(Path(app)):
            for line, name in _imports(relative):
                target = name.split(".", 1)[0]
                if target in APPS and target != app:
                    edges[(app, target)].append(f"{relative}:{line} imports {name}")
    return edges


# The apps from the top floor down: an app may import only the apps of the floors below
# its own (two apps on one floor know nothing of each other).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("snapshots",),
    ("sandboxes",),
    ("templates",),
    # Generic: the apps whose creates honour an Idempotency-Key register with it. And the
    # nodes seam: which host holds a sandbox and the runtime that acts there (templates
    # build on it too: their images and build sandboxes are a node's).
    ("idempotency", "nodes"),
    ("e2bfacade",),
)


def test_every_app_imports_only_the_apps_below_it() -> None:
    floor = {app: n for n, layer in enumerate(LAYERS) for app in layer}
    assert set(floor) == set(APPS), "every app has a floor"
    upward = {
        (a, b): lines for (a, b), lines in _app_dependencies().items() if floor[b] <= floor[a]
    }
    report = [f"{a} -> {b} (not below it): {line}" for (a, b), ls in upward.items() for line in ls]
    assert not upward, "imports that do not point down the layers:\n" + "\n".join(report)


def test_no_two_apps_import_each_other() -> None:
    edges = _app_dependencies()
    cycles = sorted((a, b) for (a, b) in edges if a < b and (b, a) in edges)

    report = []
    for a, b in cycles:
        report.append(f"{a} <-> {b}:")
        report += [f"  {line}" for line in edges[(a, b)] + edges[(b, a)]]
    assert not cycles, "apps that import each other both ways:\n" + "\n".join(report)


def test_the_runtime_imports_nothing_of_django_or_of_the_apps() -> None:
    offending: list[str] = []
    for relative in _sources(RUNTIME):
        for line, name in _imports(relative):
            top = name.split(".", 1)[0]
            outside_runtime = top == "e2bfacade" and not (
                name == "e2bfacade.runtime" or name.startswith("e2bfacade.runtime.")
            )
            if top in NOT_FOR_RUNTIME or outside_runtime:
                offending.append(f"{relative}:{line} imports {name}")

    assert list(_sources(RUNTIME)), "no runtime sources found: has e2bfacade/runtime moved?"
    assert not offending, "e2bfacade/runtime must stay a Django-free library:\n" + "\n".join(
        offending
    )


# ------------------------------------------------------------------ the runtime's modules
def _module_of(relative: Path) -> str:
    parts = list(relative.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_graph() -> dict[str, set[str]]:
    """Module -> the runtime modules it imports: every statement counts, type-only ones
    (under ``TYPE_CHECKING``) and function-local ones included. ``from a.b import c`` points
    at ``a.b.c`` when that is a module, else at ``a.b``."""
    modules = {_module_of(r): r for r in _sources(RUNTIME)}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, relative in modules.items():
        for _, name in _imports(relative):
            parts = name.split(".")
            while parts and ".".join(parts) not in modules:
                parts.pop()
            target = ".".join(parts)
            if target and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_check_sees_a_cycle() -> None:
    """Guards the check below against a graph that finds nothing."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _runtime_graph()
    assert "e2bfacade.runtime.base" in graph["e2bfacade.runtime.registry"]


def test_no_import_cycle_inside_the_runtime() -> None:
    """No module of e2bfacade/runtime reaches itself through its imports, type-only and
    function-local ones included: the API (errors, specs, the guest's half, volumes, the
    host's half) sits below the host layer, which sits below the sandboxers."""
    cycles = _cycles(_runtime_graph())
    assert not cycles, "import cycles inside e2bfacade/runtime:\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )


def test_no_driver_subclasses_another() -> None:
    """A way of running a sandbox is a sandboxer given to the host runtime, not a subclass
    of a driver overriding its methods (docs/ARCHITECTURE.md, "The host runtime and its
    sandboxers")."""
    pattern = re.compile(r'class \w+\((Local|Gvisor)Runtime\)|cast\("LocalRuntime"')
    offending = [
        f"{relative}:{n}"
        for relative in _sources(Path("e2bfacade"))
        for n, line in enumerate((ROOT / relative).read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert not offending, "drivers that subclass a driver:\n" + "\n".join(offending)


def test_a_driver_on_the_host_runtime_only_names_its_sandboxer() -> None:
    """``LocalRuntime`` and ``GvisorRuntime`` pair the host runtime with a sandboxer: they
    add and replace no method (what differs between drivers is the sandboxer's)."""
    from e2bfacade.runtime import registry
    from e2bfacade.runtime.local.driver import HostRuntime

    allowed = {"__module__", "__qualname__", "__doc__", "__annotations__", "sandboxer_class"}
    allowed |= {"__firstlineno__", "__static_attributes__", "__annotate_func__"}
    for name in registry.HOST_DRIVERS:
        cls = registry.host_driver_class(name)
        assert cls.__bases__ == (HostRuntime,), name
        assert set(vars(cls)) - allowed == {"name", "capabilities"}, name  # __init_subclass__
        assert cls.name == name == cls.sandboxer_class.name


# The nodes seam, and what reaches the process's runtime registry below it: the registry
# itself and the metering it wraps every runtime in, the settings that check the driver's
# name, the configured driver class's declared capabilities (no runtime is built) and the
# readiness probe of this process's runtime.
SEAM = Path("nodes")
RUNTIME_REGISTRY = ("e2bfacade.sandbox_runtime", "e2bfacade.runtime.registry")
REGISTRY_PLUMBING = {
    Path("e2bfacade/sandbox_runtime.py"),
    Path("e2bfacade/observability.py"),
    Path("e2bfacade/settings.py"),
    Path("e2bfacade/capabilities.py"),
    Path("e2bfacade/views.py"),
}
# A name for the registry in any form: an import, a dotted string, a call.
REGISTRY_TEXT = re.compile(r"\bget_runtime\b|e2bfacade\.sandbox_runtime\b|\bruntime\.registry\b")


def _registry_uses(relative: Path) -> Iterator[str]:
    for line, name in _imports(relative):
        if any(name == m or name.startswith(m + ".") for m in RUNTIME_REGISTRY):
            yield f"{relative}:{line} imports {name}"
    for number, text in enumerate((ROOT / relative).read_text().splitlines(), 1):
        if REGISTRY_TEXT.search(text):
            yield f"{relative}:{number}: {text.strip()}"


def test_only_the_nodes_seam_reaches_the_runtime_registry() -> None:
    offending: list[str] = []
    for app in APPS:
        for relative in _sources(Path(app), exempt=set()):  # the worker included
            if relative.is_relative_to(SEAM) or relative.is_relative_to(RUNTIME):
                continue
            if relative not in REGISTRY_PLUMBING:
                offending += _registry_uses(relative)
    assert not offending, (
        "ask nodes.selectors for a node's runtime (runtime_for, sandbox_runtime, "
        "local_runtime), never the registry:\n" + "\n".join(offending)
    )
    # The scan sees what it looks for: the seam itself asks the registry.
    assert any(_registry_uses(Path("nodes/selectors.py")))


def _host_comparisons(relative: Path) -> Iterator[str]:
    """``row.host == …``, ``… != runtime.host_id``, ``h in ("", node.host_id)``: a row's
    host compared with a node's (``.host`` of a row, ``.host_id`` of a runtime or a node)."""
    tree = ast.parse((ROOT / relative).read_text(), filename=str(relative))
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        sides: list[ast.expr] = []
        for side in [node.left, *node.comparators]:
            sides += side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
        named = any(
            isinstance(side, ast.Attribute) and side.attr in ("host", "host_id") for side in sides
        )
        if named and not all(isinstance(op, ast.Is | ast.IsNot) for op in node.ops):
            yield f"{relative}:{node.lineno}: {ast.unparse(node)}"


def test_only_the_nodes_seam_compares_a_row_host_with_a_node() -> None:
    offending: list[str] = []
    for app in APPS:
        for relative in _sources(Path(app), exempt=set()):
            if not (relative.is_relative_to(SEAM) or relative.is_relative_to(RUNTIME)):
                offending += _host_comparisons(relative)
    assert not offending, (
        "whether a row is this node's is the seam's to say (nodes.selectors: node_for_sandbox, "
        "node_for_volume, is_local, node_named):\n" + "\n".join(offending)
    )
    assert any(_host_comparisons(Path("nodes/selectors.py")))
