"""Read an installed package's source as AST without importing it, for cheap config checks:
importing GEM or reasoning-gym costs seconds and changes process state; reading files does not."""

from __future__ import annotations

import ast
import difflib
import importlib.util
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=8)
def package_dir(name: str) -> Path | None:
    """The folder of an installed top-level package (found, not imported), or None."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=512)
def parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def module_file(root: Path, dotted: str, package: str) -> Path | None:
    """The file of module `dotted` (e.g. `gem.envs.x`) inside `package`, installed at `root`."""
    parts = dotted.split(".")
    if parts[0] != package:
        return None
    base = root.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def literal_assigns(tree: ast.Module) -> dict[str, object]:
    """Module-level `NAME = <literal>` bindings."""
    out: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = value
    return out


def init_params(root: Path, package: str, dotted: str, class_name: str) -> list[str] | None:
    """Keyword parameters of `class_name.__init__` in module `dotted`, following one
    `from .x import Cls` re-export; None when the class cannot be found by reading."""
    for _ in range(3):
        path = module_file(root, dotted, package)
        tree = parse(path) if path is not None else None
        if path is None or tree is None:
            return None
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == class_name:
                return _init_args(node)
        source = _reexport(tree, class_name)
        if source is None:
            return None
        dotted = _resolve_relative(dotted, path, source)
    return None


def _init_args(cls: ast.ClassDef) -> list[str] | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            args = node.args
            names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
            return [n for n in names if n != "self"]
    return None


def _reexport(tree: ast.Module, name: str) -> ast.ImportFrom | None:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == name for a in node.names):
            return node
    return None


def _resolve_relative(dotted: str, path: Path, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = dotted.split(".") if path.name == "__init__.py" else dotted.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


def unknown_name(kind: str, value: str, known: list[str], hint: str = "") -> str:
    """An error message for a name that is not in `known`, with the closest known names."""
    close = difflib.get_close_matches(value, known, n=3, cutoff=0.6)
    if close:
        return f"unknown {kind} {value!r}. Did you mean {', '.join(repr(c) for c in close)}?{hint}"
    examples = ", ".join(repr(k) for k in sorted(known)[:8])
    return f"unknown {kind} {value!r}. Known ones include {examples}, ...{hint}"


def require(package: str, extra: str) -> None:
    """Raise ImportError (shown by the catalog as "not importable") when `package` is missing."""
    if package_dir(package) is None:
        raise ImportError(
            f"the {package!r} package is not installed; install it with: "
            f"pip install -e '.[{extra}]'"
        )
