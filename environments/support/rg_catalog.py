"""reasoning-gym's dataset names and config fields, read from its installed source (no import):
its modules call `register_dataset(NAME, DatasetCls, ConfigCls)`, which a regex finds fast."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from environments.support.pkgsrc import package_dir, parse, unknown_name

PACKAGE = "reasoning_gym"
# Datasets whose config is not plain JSON (composite takes a list of DatasetSpec objects).
UNSUPPORTED = {"composite": "it mixes other datasets through DatasetSpec objects, not JSON"}
# Fields the adapter sets itself from its own config fields.
OWN_FIELDS = {"size": "size", "seed": "dataset_seed"}
# register_dataset(NAME_OR_"literal", DatasetCls, ConfigCls, ...)
_REGISTER = re.compile(
    r"^register_dataset\(\s*(\"[^\"]+\"|'[^']+'|\w+)\s*,\s*\w+\s*,\s*(\w+)", re.MULTILINE
)


@dataclass(frozen=True)
class DatasetSource:
    name: str
    path: Path
    config_class: str | None


@lru_cache(maxsize=1)
def datasets() -> dict[str, DatasetSource]:
    """Every registered dataset by name; empty when reasoning-gym is not installed."""
    root = package_dir(PACKAGE)
    if root is None:
        return {}
    found: dict[str, DatasetSource] = {}
    for path in sorted(root.rglob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        # A regex over the text, not a parse: parsing ~100 modules takes about a second.
        for first, config in _REGISTER.findall(text):
            name = first[1:-1] if first[0] in "\"'" else _constant(text, first)
            if name:
                found[name] = DatasetSource(name, path, config)
    return found


def names() -> list[str]:
    return sorted(datasets())


def check_dataset(name: str) -> None:
    """Raise ValueError (with close names) unless `name` is a usable dataset."""
    known = datasets()
    if not known:
        raise ValueError(
            "reasoning-gym is not installed; install the extra: pip install -e '.[reasoning-gym]'"
        )
    if name in UNSUPPORTED:
        raise ValueError(f"dataset {name!r} is not supported here: {UNSUPPORTED[name]}")
    if name not in known:
        raise ValueError(unknown_name("reasoning-gym dataset", name, sorted(known)))


def config_fields(name: str) -> frozenset[str] | None:
    """Field names of the dataset's config dataclass, or None when they cannot be read."""
    source = datasets().get(name)
    if source is None or source.config_class is None:
        return None
    tree = parse(source.path)
    if tree is None:
        return None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == source.config_class:
            if node.bases:  # inherited fields would be missed: do not guess
                return None
            return frozenset(
                stmt.target.id
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            )
    return None


def check_dataset_config(name: str, values: dict[str, Any]) -> None:
    """Refuse keys the dataset's config does not have (values are checked when it is built)."""
    for key in values:
        if key in OWN_FIELDS:
            raise ValueError(
                f"dataset_config must not set {key!r}: use the {OWN_FIELDS[key]!r} field"
            )
    fields = config_fields(name)
    if fields is None:
        return
    for key in values:
        if key not in fields:
            usable = sorted(fields - set(OWN_FIELDS))
            raise ValueError(
                unknown_name(
                    f"dataset_config key for {name}",
                    key,
                    usable,
                    hint=f" Its fields: {', '.join(usable)}.",
                )
            )


def _constant(text: str, name: str) -> str | None:
    match = re.search(rf"^{re.escape(name)}\s*=\s*[\"']([^\"']+)[\"']", text, re.MULTILINE)
    return match.group(1) if match else None
