"""The package's shape, read from its imports and classes with ``ast``.

Five rules keep the layout readable (docs/development.md): no import
cycles between modules (``TYPE_CHECKING`` imports included: a cycle that only
type checkers see still means two modules that must be read together); the
pure wing (``policy/``, ``schedules/``) imports nothing that does I/O; no
module grows past what can be read in one sitting; the tick's decisions live
in ``policy/``, import nothing with I/O or the clock and keep no state of
their own; and no class is assembled from parts that exist only to be mixed
in (a part gets an object of its own, handed to the class that uses it).
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


# The tick's pure decisions: a claimed routine's windows, and a due retry.
DECISIONS = ("policy/decide.py", "policy/claimed.py", "policy/retries.py")
# Besides FORBIDDEN_FOR_PURE, what a decision never touches: the clock,
# threads, sockets, processes, logging, Celery.
FORBIDDEN_FOR_DECISIONS = (
    *FORBIDDEN_FOR_PURE,
    "time",
    "threading",
    "socket",
    "subprocess",
    "asyncio",
    "logging",
    "celery",
)
# Decorators that keep answers in the module between calls.
CACHING_DECORATORS = ("cache", "lru_cache", "cached")
MUTABLE_VALUES = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def _constant_name(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")  # __all__
    return dunder or name.lstrip("_").isupper()


def _module_state(tree: ast.Module) -> list[str]:
    """Top-level names that hold state between calls: a mutable value bound
    to a name that does not say it is a constant, or a caching decorator."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = node.value
            mutable = isinstance(value, MUTABLE_VALUES) or (
                isinstance(value, ast.Call)
                and isinstance(value.func, ast.Name)
                and value.func.id in ("dict", "list", "set", "defaultdict", "OrderedDict")
            )
            for target in targets:
                if mutable and isinstance(target, ast.Name) and not _constant_name(target.id):
                    found.append(target.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                name = (
                    called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
                )
                if name in CACHING_DECORATORS:
                    found.append(f"@{_base_name(called)} {node.name}")
    return found


def misplaced_decisions(root: Path = ROOT) -> list[str]:
    problems = [
        f"{relative} is missing" for relative in DECISIONS if not (root / relative).exists()
    ]
    if (root / "tick" / "decide.py").exists():
        problems.append("tick/decide.py exists: decisions live in policy/")
    for relative in DECISIONS:
        path = root / relative
        if not path.exists():
            continue
        for target in sorted(imports_of(path, root, names=False)):
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN_FOR_DECISIONS):
                problems.append(f"{relative} imports {target}")
        for name in _module_state(ast.parse(path.read_text(), str(path))):
            problems.append(f"{relative} keeps module state in {name}")
    return problems


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def mixed_in(root: Path = ROOT) -> list[str]:
    """Classes of the package built from package classes that only exist to
    be mixed in: a class with no base of its own, no ``__init__``, never
    called anywhere in the package, yet a base of another class (it reads
    what its host provides through ``self``). A class with two or more
    package classes as bases is reported too."""
    classes: dict[str, ast.ClassDef] = {}
    called: set[str] = set()
    trees = [ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))]
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                classes.setdefault(node.name, node)
            elif isinstance(node, ast.Call) and (name := _base_name(node.func)):
                called.add(name)

    def mixin_only(name: str) -> bool:
        part = classes[name]
        own_bases = [b for b in part.bases if _base_name(b) not in (None, "object")]
        has_init = any(
            isinstance(item, ast.FunctionDef) and item.name == "__init__" for item in part.body
        )
        return not own_bases and not has_init and name not in called

    problems = []
    for cls in classes.values():
        ours = [name for b in cls.bases if (name := _base_name(b)) in classes]
        if len(ours) > 1:
            problems.append(f"{cls.name} mixes {', '.join(ours)}")
        problems.extend(f"{cls.name} inherits mixin {name}" for name in ours if mixin_only(name))
    return sorted(set(problems))


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_pure_wing_imports_nothing_with_io() -> None:
    assert forbidden_imports() == []


def test_no_module_is_longer_than_one_sitting() -> None:
    assert long_modules() == []


def test_the_decisions_are_pure_and_live_in_policy() -> None:
    assert misplaced_decisions() == []


def test_no_class_is_assembled_from_mixins() -> None:
    assert mixed_in() == []


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


def test_a_decision_out_of_place_or_with_io_or_state_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "tick/__init__.py": "",
            "tick/decide.py": "",
            "policy/__init__.py": "",
            "policy/decide.py": "import time\n_plans: dict[str, int] = {}\nSHARED = 10\n",
            "policy/claimed.py": "import functools\n@functools.lru_cache\ndef f():\n    pass\n",
        },
    )
    assert misplaced_decisions(root) == [
        "policy/retries.py is missing",
        "tick/decide.py exists: decisions live in policy/",
        "policy/decide.py imports time",
        "policy/decide.py keeps module state in _plans",
        "policy/claimed.py keeps module state in @lru_cache f",
    ]


def test_a_class_built_from_mixins_is_found(tmp_path: Path) -> None:
    part = "class Writing:\n    store: object\n\n    def write(self):\n        return self.store\n"
    whole = (
        "from .writing import Writing\n\n\nclass Base:\n    def __init__(self):\n"
        "        self.store = 1\n\n\nclass Engine(Writing):\n    pass\n\n\n"
        "class Both(Base, Writing):\n    pass\n\n\nclass Real(Base):\n    pass\n"
    )
    root = _tree(tmp_path, {"writing.py": part, "engine.py": whole})
    assert mixed_in(root) == [
        "Both inherits mixin Writing",
        "Both mixes Base, Writing",
        "Engine inherits mixin Writing",
    ]
