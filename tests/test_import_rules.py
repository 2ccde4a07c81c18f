"""The layering the code relies on (docs/architecture.md), checked on the source: every import statement of
every module, including those inside functions and under ``TYPE_CHECKING``, parsed with ``ast``.

- ``kernels`` is pure numerics: it imports none of the service packages;
- ``core`` (settings, logging, queue, statuses) imports none of api, worker, store, cli;
- ``store`` imports neither api nor worker (nor cli);
- the API never imports the worker (it rings the queue through ``core.queue.send``) and the worker never the API;
- the CLI talks to the API over HTTP and starts the worker as a process: it imports neither;
- ``plots`` draws from what a job stored: it imports kernels (the registry, the kinds' names) and none of api,
  cli, store, worker; nothing below the API imports it;
- the service (api, worker, cli) reaches an estimator family (a ``kernels`` subpackage) only through the
  registry and the kit modules ``kernels/*.py``: it imports no family;
- a router does not import another router (shared queries live in ``store``);
- no module imports another module's private (``_``-prefixed) name.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("api", "cli", "core", "kernels", "plots", "store", "worker")
FORBIDDEN: dict[str, frozenset[str]] = {
    "kernels": frozenset({"api", "cli", "core", "plots", "store", "worker"}),
    "core": frozenset({"api", "cli", "plots", "store", "worker"}),
    "store": frozenset({"api", "cli", "plots", "worker"}),
    "api": frozenset({"cli", "worker"}),
    "worker": frozenset({"api", "cli", "plots"}),
    "cli": frozenset({"api", "plots", "worker"}),
    "plots": frozenset({"api", "cli", "store", "worker"}),
}
SERVICE = ("api", "cli", "worker")
FAMILIES = frozenset(path.parent.name for path in (ROOT / "kernels").glob("*/__init__.py"))
ROUTERS = "api.routes"


@dataclass(frozen=True)
class Import:
    importer: str  # dotted module name of the importing file
    module: str  # dotted name of the module imported (or imported from)
    names: tuple[str, ...]  # the names of a ``from module import ...``
    line: int

    def where(self) -> str:
        return f"{self.importer.replace('.', '/')}.py:{self.line}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _absolute(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports_of(path: Path) -> Iterator[Import]:
    importer = module_name(path)
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(importer, alias.name, (), node.lineno)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(importer, path.name == "__init__.py", node)
            yield Import(importer, module, tuple(alias.name for alias in node.names), node.lineno)


def all_imports() -> list[Import]:
    found: list[Import] = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.extend(imports_of(path))
    return found


IMPORTS = all_imports()


def top(name: str) -> str:
    return name.split(".", 1)[0]


def test_the_scan_sees_the_imports_it_guards() -> None:
    importers = {statement.importer for statement in IMPORTS}
    assert {"api.app", "worker.tasks", "core.queue", "store.jobs", "cli.main"} <= importers
    assert any(statement.module == "core.queue" and statement.importer.startswith("api.") for statement in IMPORTS)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_packages_import_only_the_layers_below_them(package: str) -> None:
    forbidden = FORBIDDEN[package]
    broken = [
        f"{statement.where()}: {statement.module}"
        for statement in IMPORTS
        if top(statement.importer) == package and top(statement.module) in forbidden
    ]
    assert not broken, f"{package} must not import {sorted(forbidden)}: {broken}"


def test_routers_do_not_import_each_other() -> None:
    broken = [
        f"{statement.where()}: {statement.module}"
        for statement in IMPORTS
        if statement.importer.startswith(f"{ROUTERS}.")
        and statement.module.startswith(f"{ROUTERS}.")
        and statement.module != statement.importer
    ]
    assert not broken, f"shared queries belong in store/, not in another router: {broken}"


def test_no_module_imports_a_private_name_of_another() -> None:
    broken = [
        f"{statement.where()}: from {statement.module} import {name}"
        for statement in IMPORTS
        if top(statement.module) in PACKAGES and statement.module != statement.importer
        for name in statement.names
        if name.startswith("_") and not name.startswith("__")
    ]
    assert not broken, f"make the name public or move it: {broken}"


def family_imported(statement: Import) -> str | None:
    """The estimator family (``kernels.<family>``) an import statement reaches, or None."""
    parts = statement.module.split(".")
    if parts[0] != "kernels":
        return None
    if len(parts) > 1:
        return parts[1] if parts[1] in FAMILIES else None
    return next((name for name in statement.names if name in FAMILIES), None)  # from kernels import crve


def test_the_families_are_found() -> None:
    assert {"crve", "sccs", "ks", "dualcontrol"} <= FAMILIES


@pytest.mark.parametrize("package", SERVICE)
def test_the_service_imports_no_estimator_family(package: str) -> None:
    broken = [
        f"{statement.where()}: {statement.module} {statement.names}"
        for statement in IMPORTS
        if top(statement.importer) == package and family_imported(statement) is not None
    ]
    assert not broken, f"{package} reaches a kind through kernels.registry, never a family's module: {broken}"


def test_the_family_rule_sees_a_family_import() -> None:
    assert family_imported(Import("worker.x", "kernels.crve.montecarlo_chunks", (), 1)) == "crve"
    assert family_imported(Import("worker.x", "kernels", ("sccs",), 1)) == "sccs"
    assert family_imported(Import("worker.x", "kernels.registry", ("get_kind",), 1)) is None


# --- no import cycle --------------------------------------------------------------------------------------

CYCLE_PACKAGES = ("api", "cli", "core", "kernels", "store", "worker", "plots")


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and (
        (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
        or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
    )


def runtime_imports(source: str, importer: str, is_package: bool = False) -> Iterator[Import]:
    """The import statements of a module's source that run: every one, at module level or inside a function,
    except those under ``if TYPE_CHECKING:`` (never executed, so they tie no modules together at runtime)."""
    pending: list[ast.AST] = [ast.parse(source)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            yield from (Import(importer, alias.name, (), node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(importer, is_package, node)
            yield Import(importer, module, tuple(alias.name for alias in node.names), node.lineno)
        if _is_type_checking_block(node):
            assert isinstance(node, ast.If)
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def _cycle_imports() -> list[Import]:
    found: list[Import] = []
    for package in CYCLE_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found.extend(runtime_imports(path.read_text(), module_name(path), path.name == "__init__.py"))
    return found


def module_graph(statements: list[Import]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports, from every import statement, those inside functions
    included (they run, later: a cycle behind one still ties the two modules together). A ``from package
    import name`` counts as an import of ``package.name`` where that is a module of the project."""
    modules = {statement.importer for statement in statements}
    graph: dict[str, set[str]] = {module: set() for module in modules}
    for statement in statements:
        targets = {f"{statement.module}.{name}" for name in statement.names} & modules
        if statement.module in modules and not targets:
            targets = {statement.module}
        graph[statement.importer] |= targets - {statement.importer}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the list of its modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)) is not None:
            return cycle
    return None


def test_the_cycle_check_finds_a_cycle_behind_an_import_inside_a_function() -> None:
    module_b = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from pkg.c import C\n"
        "def load():\n    from . import a\n    return a\n"
    )
    statements = [*runtime_imports("from pkg.b import load\n", "pkg.a"), *runtime_imports(module_b, "pkg.b"),
                  *runtime_imports("import pkg.b\n", "pkg.c")]
    graph = module_graph(statements)
    assert graph == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.a"}, "pkg.c": {"pkg.b"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
    assert find_cycle({"pkg.a": {"pkg.b"}, "pkg.b": set()}) is None


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(module_graph(_cycle_imports()))
    assert cycle is None, f"import cycle (place the shared piece in a module below both): {' -> '.join(cycle or [])}"
