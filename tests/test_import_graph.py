"""The package's import graph, read with ast: no cycles between modules or between packages, and
imports inside functions only of optional dependencies (so a missing extra fails where it is used,
never at `import attention_zoo`), which in turn are never imported at module level."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import attention_zoo

PACKAGE = Path(attention_zoo.__file__).parent
ROOT = PACKAGE.name

# Packages the extras in pyproject.toml install; a function imports them where it needs them.
OPTIONAL = frozenset(
    {
        "transformers",  # bench: Hugging Face peers, checkpoints (from_hf / to_hf)
        "safetensors",  # comes with transformers: HF checkpoint files
        "reformer_pytorch",  # bench: lucidrains' Reformer peer
        "local_attention",  # peers extra
        "performer_pytorch",
        "linformer",
        "nystrom_attention",
        "pandas",  # report extra
        "seaborn",
        "matplotlib",
        "xformers",  # cuda extra
        "fla",  # cuda extra: fla-core's Triton kernels
        "ray",  # ray extra
    }
)

# Imports inside functions of code every install has: module -> what it imports there, each
# with its reason. Empty: every such import is at the top of its module. Never add one.
PENDING: dict[str, set[str]] = {}


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module (a submodule when `from pkg import submodule`)
    line: int
    in_function: bool
    name: str | None = None  # the name taken (`from target import name`); None: `import target`


def module_name(path: Path) -> str:
    parts = [ROOT, *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(module: str, path: Path) -> Iterator[Import]:
    """Every import of `module`; those under `if TYPE_CHECKING:` count as module level (a cycle of
    annotations is still two modules that need each other)."""
    is_package = path.name == "__init__.py"

    def targets(node: ast.Import | ast.ImportFrom) -> list[tuple[str, str | None]]:
        if isinstance(node, ast.Import):
            return [(a.name, None) for a in node.names]
        base = node.module or ""
        if node.level:
            here = module.split(".") if is_package else module.split(".")[:-1]
            here = here[: len(here) - node.level + 1]
            base = ".".join([*here, node.module] if node.module else here)
        out = []
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            out.append((sub, None) if sub in MODULES else (base, alias.name))
        return out

    def walk(node: ast.AST, in_function: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            yield from walk_one(child, in_function)

    def walk_one(node: ast.AST, in_function: bool) -> Iterator[Import]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            for target, name in targets(node):
                yield Import(module, target, node.lineno, in_function, name)
            return
        nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        yield from walk(node, nested)

    yield from walk(ast.parse(path.read_text(), str(path)), False)


@functools.cache
def all_imports() -> list[Import]:
    """Every import of the package, read once, when a test first asks (not while collecting)."""
    return [i for m, p in MODULES.items() for i in imports_of(m, p)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def module_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for i in all_imports():
        if not i.in_function and i.target in MODULES and i.target != i.module:
            graph[i.module].add(i.target)
    return graph


def unit(module: str) -> str:
    """The package (or top-level module) a module belongs to: attention_zoo.measure.cases ->
    attention_zoo.measure; the package's own __init__ is `attention_zoo`."""
    return ".".join(module.split(".")[:2])


@pytest.mark.slow
def test_no_import_cycles_between_modules() -> None:
    assert cycles(module_graph()) == []


def test_no_import_cycles_between_packages() -> None:
    """Packages form layers: nothing imports upwards (the top-level package included)."""
    graph: dict[str, set[str]] = {}
    for module, targets in module_graph().items():
        for target in targets:
            if unit(target) != unit(module):
                graph.setdefault(unit(module), set()).add(unit(target))
    assert cycles(graph) == []


def test_functions_import_only_optional_dependencies() -> None:
    found: dict[str, set[str]] = {}
    for i in all_imports():
        if i.in_function and i.target.split(".")[0] not in OPTIONAL:
            found.setdefault(i.module, set()).add(i.target)
    moved = {m: PENDING[m] - found.get(m, set()) for m in PENDING}
    assert {m: t for m, t in moved.items() if t} == {}, "moved up: delete from PENDING"
    assert {
        m: t - PENDING.get(m, set()) for m, t in found.items() if t - PENDING.get(m, set())
    } == {}


def test_optional_dependencies_are_never_imported_at_module_level() -> None:
    top = [
        f"{i.module}:{i.line} {i.target}"
        for i in all_imports()
        if not i.in_function and i.target.split(".")[0] in OPTIONAL
    ]
    assert top == []


def test_backends_build_on_shared_layers_not_on_each_other() -> None:
    """A backend's module imports no other backend's module (a backend it composes, as NSA's
    window branch is sliding-window, comes from the registry by name), and no module of the
    package imports a name another of its modules keeps private (a leading underscore)."""
    backends = {spec.cls.__module__ for spec in attention_zoo.list_backends()}
    backends = {m for m in backends if m.startswith(f"{ROOT}.")}
    assert len(backends) >= 20  # every built-in backend module, read from the registry
    crossing = [
        f"{i.module}:{i.line} {i.target}"
        for i in all_imports()
        if i.module in backends and i.target in backends and i.target != i.module
    ]
    assert crossing == []
    private = [
        f"{i.module}:{i.line} {i.target}.{i.name}"
        for i in all_imports()
        if i.target in MODULES
        and i.name is not None
        and i.name.startswith("_")
        and not i.name.startswith("__")
    ]
    assert private == []


def test_the_graph_sees_the_imports_it_checks() -> None:
    """The reader resolves relative imports, `from . import module` and TYPE_CHECKING blocks
    (else the tests above could pass on an empty graph)."""
    graph = module_graph()
    assert "attention_zoo.hf_reformer" in graph["attention_zoo.config"]
    assert "attention_zoo.attention.full" in graph["attention_zoo.attention"]
    assert "attention_zoo.declarative" in graph["attention_zoo.tasks.suite"]
    assert any(i.target == "importlib.resources.abc" for i in all_imports() if not i.in_function)
    assert any(i.in_function and i.target == "transformers" for i in all_imports())
    taken = {(i.module, i.target, i.name) for i in all_imports()}
    assert ("attention_zoo.attention.nsa", "attention_zoo.attention.spec", "get_backend") in taken
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
