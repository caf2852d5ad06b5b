"""Find environment classes by reading source files as AST: nothing is imported or executed.

Three kinds. Two told apart by where their `BaseEnv` comes from: ours (`environments.base`,
the `rlcs` framework) and Atropos's (`atroposlib.envs.base`, the `atropos` framework). Ours are
the files directly in an environments folder (helpers live in its subfolders, such as
`environments/support/`). Atropos environments come as they were written, often a folder
with helper modules and a config.yaml: they are found both directly in an environments folder
and one folder down. A class counts when it derives from a root class, directly or through
classes defined in the scanned files. The third, verifiers environments (`verifiers`), come as
published: a folder with a `pyproject.toml` naming the environment and its module beside it
(verifiers/discovery.py). Results are cached per file by (mtime, size).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from core.frameworks import Framework
from core.verifiers import Generation
from server.environments.verifiers import discovery as verifiers_discovery

RLCS: Framework = "rlcs"
ATROPOS: Framework = "atropos"
ROOT_CLASSES = frozenset({"BaseEnv", "SingleTurnEnv"})
ATROPOS_MODULE = "atroposlib"


@dataclass(frozen=True)
class FoundEnv:
    name: str
    class_name: str | None
    path: Path
    description: str
    syntax_error: str | None = None
    framework: Framework = RLCS
    generation: Generation | None = None  # verifiers: v0 or v1
    folder: Path | None = None  # verifiers: the environment's folder


@dataclass(frozen=True)
class _ParsedClass:
    name: str
    bases: tuple[str, ...]  # the bases' own names, to follow classes across files
    root: Framework | None  # set when a base is one of the root classes itself
    env_name: str | None
    description: str
    abstract: bool


_cache: dict[Path, tuple[tuple[float, int], list[_ParsedClass] | str]] = {}


def scan(dirs: list[Path]) -> list[FoundEnv]:
    """All environments in `dirs`, sorted by name."""
    parsed: dict[Path, list[_ParsedClass] | str] = {}
    nested: set[Path] = set()  # files one folder down: Atropos environments only
    found: list[FoundEnv] = []
    for folder in dirs:
        if not folder.is_dir():
            continue
        for path in sorted(folder.glob("*.py")):
            if path.name != "__init__.py":
                parsed[path] = _parse_cached(path)
        for sub in sorted(p for p in folder.iterdir() if p.is_dir() and _visible(p.name)):
            published = verifiers_discovery.read_folder(sub)
            if published is not None:
                found.append(FoundEnv(**published.__dict__))
                continue
            for path in sorted(sub.glob("*.py")):
                if path not in parsed:
                    parsed[path] = _parse_cached(path, atropos_only=True)
                    nested.add(path)
    kinds = _env_class_kinds(parsed)
    for path, classes in parsed.items():
        if isinstance(classes, str):
            if path not in nested:
                found.append(FoundEnv(path.stem, None, path, "", syntax_error=classes))
            continue
        mine = [c for c in classes if c.name in kinds and not c.abstract]
        if path in nested:
            mine = [c for c in mine if kinds[c.name] == ATROPOS]
        for cls in mine:
            name = cls.env_name or (path.stem if len(mine) == 1 else _snake(cls.name))
            found.append(FoundEnv(name, cls.name, path, cls.description, None, kinds[cls.name]))
    return sorted(found, key=lambda f: f.name)


def _visible(name: str) -> bool:
    return not name.startswith((".", "_")) and name not in ("venv", "node_modules")


def _env_class_kinds(parsed: dict[Path, list[_ParsedClass] | str]) -> dict[str, Framework]:
    """Environment classes by name and their framework, following bases across files."""
    # The root classes themselves (ours, in environments/base.py) are never environments.
    classes = [
        c
        for found in parsed.values()
        if isinstance(found, list)
        for c in found
        if c.name not in ROOT_CLASSES
    ]
    kinds: dict[str, Framework] = {c.name: c.root for c in classes if c.root is not None}
    changed = True
    while changed:
        changed = False
        for cls in classes:
            if cls.name in kinds:
                continue
            inherited = next((kinds[b] for b in cls.bases if b in kinds), None)
            if inherited is not None:
                kinds[cls.name] = inherited
                changed = True
    return kinds


def _parse_cached(path: Path, atropos_only: bool = False) -> list[_ParsedClass] | str:
    try:
        stat = path.stat()
    except OSError as exc:
        return f"cannot read file: {exc.strerror}"
    key = (stat.st_mtime, stat.st_size)
    hit = _cache.get(path)
    if hit is not None and hit[0] == key:
        return hit[1]
    result = _parse(path, atropos_only)
    _cache[path] = (key, result)
    return result


def _parse(path: Path, atropos_only: bool = False) -> list[_ParsedClass] | str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read file: {exc}"
    if atropos_only and ATROPOS_MODULE not in text:
        return []  # a helper module: not worth an AST
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as exc:
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    except ValueError as exc:
        return f"cannot read file: {exc}"
    imported = _imported_names(tree)
    module_doc = ast.get_docstring(tree) or ""
    classes = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            dotted = [d for d in (_dotted(x) for x in node.bases) if d]
            qualified = [_qualify(d, imported) for d in dotted]
            roots = [k for k in (_root_kind(q) for q in qualified) if k is not None]
            attrs = _class_constants(node)
            name = attrs.get("name")
            doc = (ast.get_docstring(node) or "").strip()
            if not doc and roots and roots[0] == ATROPOS:
                doc = module_doc.strip()  # Atropos files describe themselves at the top
            classes.append(
                _ParsedClass(
                    name=node.name,
                    bases=tuple(d.rpartition(".")[2] for d in dotted),
                    root=roots[0] if roots else None,
                    env_name=name if isinstance(name, str) else None,
                    description=doc.splitlines()[0] if doc else "",
                    abstract=attrs.get("abstract") is True,
                )
            )
    return classes


def _imported_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it names (`BaseEnv` -> `atroposlib.envs.base.BaseEnv`), from every
    import in the file (those inside try/except included)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    names[alias.asname] = alias.name
                else:
                    top = alias.name.split(".")[0]
                    names[top] = top
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            for alias in node.names:
                names[alias.asname or alias.name] = f"{module}.{alias.name}"
    return names


def _qualify(dotted: str, imported: dict[str, str]) -> str:
    head, _, rest = dotted.partition(".")
    origin = imported.get(head)
    if origin is None:
        return dotted
    return f"{origin}.{rest}" if rest else origin


def _root_kind(qualified: str) -> Framework | None:
    """The framework whose root class this base is, or None for any other class."""
    module, _, name = qualified.rpartition(".")
    if module.split(".")[0] == ATROPOS_MODULE:
        return ATROPOS if name == "BaseEnv" else None
    if name not in ROOT_CLASSES:
        return None
    # environments.base, a relative `.base`, or a bare name (as files always were read).
    return RLCS


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else node.attr
    if isinstance(node, ast.Subscript):
        return _dotted(node.value)
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
