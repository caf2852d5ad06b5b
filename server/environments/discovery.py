"""Find environment classes by reading source files as AST: nothing is imported or executed.

Environments are the files directly in an environments folder; helper modules live in its
subfolders (`environments/support/`). A class counts when it derives from BaseEnv or
SingleTurnEnv, directly or through classes defined in the scanned files. Results are cached
per file by (mtime, size).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT_CLASSES = frozenset({"BaseEnv", "SingleTurnEnv"})


@dataclass(frozen=True)
class FoundEnv:
    name: str
    class_name: str | None
    path: Path
    description: str
    syntax_error: str | None = None


@dataclass(frozen=True)
class _ParsedClass:
    name: str
    bases: tuple[str, ...]
    env_name: str | None
    description: str
    abstract: bool


_cache: dict[Path, tuple[tuple[float, int], list[_ParsedClass] | str]] = {}


def scan(dirs: list[Path]) -> list[FoundEnv]:
    """All environments in `dirs` (their top-level `*.py` files), sorted by name."""
    parsed: dict[Path, list[_ParsedClass] | str] = {}
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):  # not recursive: subfolders hold helpers
            if path.name != "__init__.py":
                parsed[path] = _parse_cached(path)
    env_classes = _env_class_names(parsed)
    found: list[FoundEnv] = []
    for path, classes in parsed.items():
        if isinstance(classes, str):
            found.append(FoundEnv(path.stem, None, path, "", syntax_error=classes))
            continue
        mine = [c for c in classes if c.name in env_classes and not c.abstract]
        for cls in mine:
            name = cls.env_name or (path.stem if len(mine) == 1 else _snake(cls.name))
            found.append(FoundEnv(name, cls.name, path, cls.description))
    return sorted(found, key=lambda f: f.name)


def _env_class_names(parsed: dict[Path, list[_ParsedClass] | str]) -> set[str]:
    """Names of classes deriving from a root class, following bases across scanned files."""
    bases_of: dict[str, set[str]] = {}
    for classes in parsed.values():
        if isinstance(classes, list):
            for cls in classes:
                bases_of.setdefault(cls.name, set()).update(cls.bases)
    envs: set[str] = set()
    known = set(ROOT_CLASSES)  # roots plus every env class found so far
    changed = True
    while changed:
        changed = False
        for name, bases in bases_of.items():
            if name not in known and not bases.isdisjoint(known):
                envs.add(name)
                known.add(name)
                changed = True
    return envs


def _parse_cached(path: Path) -> list[_ParsedClass] | str:
    try:
        stat = path.stat()
    except OSError as exc:
        return f"cannot read file: {exc.strerror}"
    key = (stat.st_mtime, stat.st_size)
    hit = _cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    result = _parse(path)
    _cache[path] = (key, result)
    return result


def _parse(path: Path) -> list[_ParsedClass] | str:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read file: {exc}"
    classes = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            bases = tuple(b for b in (_base_name(x) for x in node.bases) if b)
            attrs = _class_constants(node)
            env_name = attrs.get("name")
            doc = ast.get_docstring(node) or ""
            classes.append(
                _ParsedClass(
                    name=node.name,
                    bases=bases,
                    env_name=env_name if isinstance(env_name, str) else None,
                    description=doc.strip().splitlines()[0] if doc.strip() else "",
                    abstract=attrs.get("abstract") is True,
                )
            )
    return classes


def _base_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript):
        return _base_name(node.value)
    return None


def _class_constants(node: ast.ClassDef) -> dict[str, object]:
    out: dict[str, object] = {}
    for stmt in node.body:
        target, value = None, None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            target, value = stmt.target, stmt.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            out[target.id] = value.value
    return out


def _snake(name: str) -> str:
    name = re.sub(r"Env$", "", name) or name
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()
