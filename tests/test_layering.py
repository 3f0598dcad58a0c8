"""The package's shape, read from its imports with ``ast``.

Three rules keep the layout readable (docs/development.md): no import
cycles between modules (``TYPE_CHECKING`` imports included: a cycle that only
type checkers see still means two modules that must be read together); the
pure wing (``policy/``, ``schedules/``) imports nothing that does I/O; and no
module grows past what can be read in one sitting.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "celery_routines"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
MAX_LINES = 450
PURE = ("policy", "schedules")
# What the pure wing may not import: our I/O packages and the I/O libraries.
FORBIDDEN_FOR_PURE = (
    *(
        f"{PACKAGE}.{name}"
        for name in ("store", "tick", "sending", "worker", "operator", "observe")
    ),
    "sqlalchemy",
    "redis",
    "kombu",
    "psycopg",
)


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, root: Path = ROOT, names: bool = True) -> set[str]:
    """Every module ``path`` imports, absolute, at any depth of the file
    (functions and ``if TYPE_CHECKING:`` blocks included)."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.add(target)
            if names:  # `from pkg import module` imports the module too
                found.update(f"{target}.{alias.name}" for alias in node.names)
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    files = {module_name(p, root): p for p in root.rglob("*.py") if "migrations" not in p.parts}
    return {
        name: {target for target in imports_of(path, root) if target in files and target != name}
        for name, path in files.items()
    }


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
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

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def forbidden_imports(root: Path = ROOT) -> list[str]:
    problems = []
    for pure in PURE:
        for path in sorted((root / pure).rglob("*.py")):
            for target in sorted(imports_of(path, root, names=False)):
                if any(target == f or target.startswith(f + ".") for f in FORBIDDEN_FOR_PURE):
                    problems.append(f"{module_name(path, root)} imports {target}")
    return problems


def long_modules(root: Path = ROOT, limit: int = MAX_LINES) -> list[str]:
    return [
        f"{path.relative_to(root.parent)}: {count} lines"
        for path in sorted(root.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > limit
    ]


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_pure_wing_imports_nothing_with_io() -> None:
    assert forbidden_imports() == []


def test_no_module_is_longer_than_one_sitting() -> None:
    assert long_modules() == []


# -- the rules catch what they are for ------------------------------------------


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    "files",
    [
        pytest.param({"a.py": "from . import b\n", "b.py": "from .a import x\n"}, id="plain"),
        pytest.param(
            {
                "tick/__init__.py": "",
                "tick/engine.py": "from .overlap import apply\n",
                "tick/overlap.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from celery_routines.tick.engine import Item\n"
                ),
            },
            id="type-checking-only",
        ),
    ],
)
def test_a_cycle_is_found(tmp_path: Path, files: dict[str, str]) -> None:
    assert cycles(graph(_tree(tmp_path, files))) != []


@pytest.mark.parametrize(
    "text",
    [
        "import sqlalchemy\n",
        "from kombu import Connection\n",
        "from celery_routines.store import Store\n",
        "from ..tick.engine import TickEngine\n",
        "def f():\n    import redis\n",
    ],
)
def test_an_io_import_into_policy_is_found(tmp_path: Path, text: str) -> None:
    root = _tree(tmp_path, {"policy/__init__.py": "", "policy/x.py": text})
    assert forbidden_imports(root) == [f"{PACKAGE}.policy.x imports " + _target(text)]


def _target(text: str) -> str:
    return {
        "import sqlalchemy\n": "sqlalchemy",
        "from kombu import Connection\n": "kombu",
        "from celery_routines.store import Store\n": f"{PACKAGE}.store",
        "from ..tick.engine import TickEngine\n": f"{PACKAGE}.tick.engine",
        "def f():\n    import redis\n": "redis",
    }[text]


def test_a_long_module_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"long.py": "x = 1\n" * (MAX_LINES + 1), "short.py": "x = 1\n"})
    assert long_modules(root) == [f"{PACKAGE}/long.py: {MAX_LINES + 1} lines"]
