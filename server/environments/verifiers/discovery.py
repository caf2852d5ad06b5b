"""Find verifiers environments as they are published (the verifiers repository's
`environments/`, the Environments Hub): a folder holding a `pyproject.toml` that names the
environment, and its module beside it (`name` with `-` as `_`, a file or a package), one of the
two naming verifiers (v1 environments' pyprojects often leave it out: the trainer brings it).
Read as TOML and AST: nothing is imported. v0 modules define `load_environment(**args)`; v1
modules import `verifiers.v1` and define a `Taskset` subclass (a package: in any of its files,
as its `__init__` re-exports it).
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from core.frameworks import Framework
from core.verifiers import V0_ENTRY, Generation

V1_MODULE = "verifiers.v1"


@dataclass(frozen=True)
class Published:
    """One environment folder as discovery lists it (the fields FoundEnv shares)."""

    name: str
    class_name: str | None  # v0: load_environment; v1: its Taskset class; None: not usable
    path: Path  # the module's file
    description: str
    syntax_error: str | None = None
    generation: Generation | None = None
    folder: Path | None = None  # the environment's folder (its pyproject.toml's)
    framework: Framework = "verifiers"


_cache: dict[Path, tuple[tuple[float, ...], Published | None]] = {}


def read_folder(folder: Path) -> Published | None:
    """The environment published in `folder`, or None when it holds no verifiers project."""
    pyproject = folder / "pyproject.toml"
    if not pyproject.is_file():
        return None
    key = stamp(pyproject, *_module_files(folder))
    hit = _cache.get(folder)
    if hit is not None and hit[0] == key:
        return hit[1]
    found = _read(folder, pyproject)
    found = found and replace(found, folder=folder)
    _cache[folder] = (key, found)
    return found


def _read(folder: Path, pyproject: Path) -> Published | None:
    try:
        text = pyproject.read_text(encoding="utf-8")
        project = tomllib.loads(text).get("project") or {}
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None  # not a project we can read: nothing to list
    name = str(project.get("name") or folder.name)
    description = str(project.get("description") or "").strip()
    module = name.replace("-", "_")
    path = next((p for p in _module_files(folder, module) if p.is_file()), None)
    if path is None:
        if "verifiers" not in text:
            return None  # a project of another kind (an Atropos environment's, a tool's)
        why = f"no module {module}.py (or {module}/__init__.py) beside its pyproject.toml"
        return Published(name, None, pyproject, description, why)
    sources = [path] if path.name != "__init__.py" else sorted(path.parent.glob("*.py"))
    texts: dict[Path, str] = {}
    for source in sources:
        try:
            texts[source] = source.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return Published(name, None, source, description, f"cannot read file: {exc}")
    if "verifiers" not in text and not any("verifiers" in t for t in texts.values()):
        return None
    trees: dict[Path, ast.Module] = {}
    for source, text in texts.items():
        try:
            trees[source] = ast.parse(text, filename=str(source))
        except SyntaxError as exc:
            why = f"SyntaxError: {exc.msg} ({source.name}, line {exc.lineno})"
            return Published(name, None, source, description, why)
        except ValueError as exc:
            return Published(name, None, source, description, f"cannot read file: {exc}")
    entry = trees[path]
    description = description or (ast.get_docstring(entry) or "").strip().split("\n")[0]
    if any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == V0_ENTRY
        for node in entry.body
    ):
        return Published(name, V0_ENTRY, path, description, generation="v0")
    for tree in trees.values():
        taskset = _v1_taskset(tree)
        if taskset is not None:
            return Published(name, taskset, path, description, generation="v1")
    why = f"{path.name} defines neither {V0_ENTRY} (v0) nor a {V1_MODULE} Taskset (v1)"
    return Published(name, None, path, description, why)


def _v1_taskset(tree: ast.Module) -> str | None:
    """The module's Taskset subclass (`vf.Taskset` with `import verifiers.v1 as vf`, or
    `Taskset` from `verifiers.v1`), or None."""
    aliases: set[str] = set()  # names that stand for verifiers.v1
    direct: set[str] = set()  # names that stand for verifiers.v1.Taskset
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == V1_MODULE and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == V1_MODULE:
            direct |= {a.asname or a.name for a in node.names if a.name == "Taskset"}
        elif isinstance(node, ast.ImportFrom) and node.module == "verifiers":
            aliases |= {a.asname or a.name for a in node.names if a.name == "v1"}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for base in (b.value if isinstance(b, ast.Subscript) else b for b in node.bases):
            if isinstance(base, ast.Name) and base.id in direct:
                return node.name
            if (
                isinstance(base, ast.Attribute)
                and base.attr == "Taskset"
                and isinstance(base.value, ast.Name)
                and base.value.id in aliases
            ):
                return node.name
    return None


def _module_files(folder: Path, module: str | None = None) -> list[Path]:
    if module is None:
        return sorted(folder.glob("*.py")) + sorted(folder.glob("*/*.py"))
    return [folder / f"{module}.py", folder / module / "__init__.py"]


def stamp(*paths: Path) -> tuple[float, ...]:
    """The files' (mtime, size) pairs, those that exist: a change to any of them changes it."""
    out: list[float] = []
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        out += [stat.st_mtime, float(stat.st_size)]
    return tuple(out)
