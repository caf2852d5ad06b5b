"""The package layers: core at the bottom, then environments, then server and runners side by
side; cli stands alone. Read from the source (every import, function-level ones too) and
checked once more by importing each module in a clean interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = ("core", "environments", "server", "runners", "cli")
# What each package may import of ours (itself included).
ALLOWED = {
    "core": {"core"},
    "environments": {"core", "environments"},
    "server": {"core", "environments", "server"},
    "runners": {"core", "environments", "runners"},
    "cli": {"cli"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in OURS:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Our modules that `name` imports anywhere in its file (resolved to known modules)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets.add(base)
            # `from pkg import module` imports the module too.
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    resolved = set()
    for target in targets:
        if target.split(".")[0] not in OURS:
            continue
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports_of(name, path, known) for name, path in found.items()}


def test_each_package_imports_only_the_layers_below_it() -> None:
    wrong = []
    for name, targets in graph().items():
        allowed = ALLOWED[name.split(".")[0]]
        wrong += [f"{name} -> {t}" for t in sorted(targets) if t.split(".")[0] not in allowed]
    assert not wrong, "imports that run back up:\n" + "\n".join(wrong)


def test_no_import_circles() -> None:
    edges = graph()
    state: dict[str, int] = {}
    circles: list[str] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append(" -> ".join([*trail[trail.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_checker_sees_a_function_level_import(tmp_path: Path) -> None:
    """The reader must catch an import hidden in a function, or the tests above prove little."""
    source = tmp_path / "probe.py"
    source.write_text(
        "def f():\n    from server.settings import x\n    import runners.train.loop\n"
    )
    known = {"server", "server.settings", "runners", "runners.train"}
    assert imports_of("environments.probe", source, known) == {"server.settings", "runners.train"}


@pytest.mark.parametrize("package", ["core", "environments", "runners"])
def test_importing_every_module_loads_nothing_from_above(package: str) -> None:
    # `python -m` entry points (`__main__`) run their process when imported.
    names = sorted(
        n for n in modules() if n.split(".")[0] == package and not n.endswith(".__main__")
    )
    script = (
        "import importlib, json, sys\n"
        f"for name in {names!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1])) & set(OURS)
    assert loaded <= ALLOWED[package], f"{package} loaded {sorted(loaded - ALLOWED[package])}"
