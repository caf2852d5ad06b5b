"""What GEM offers (ids, wrappers, constructor keywords), read from its installed source: `import
gem` takes seconds, imports reasoning-gym and reconfigures logging, which the server must not."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from environments.support import rg_catalog
from environments.support.pkgsrc import (
    init_params,
    literal_assigns,
    package_dir,
    parse,
    unknown_name,
)

PACKAGE = "gem"

# Families whose data comes from the Hugging Face hub (and `datasets`): not usable offline.
NETWORK_FAMILIES = {
    "math": "downloads its dataset from the Hugging Face hub (needs the network and `datasets`)",
    "code": "downloads its dataset from the Hugging Face hub (needs the network and `datasets`)",
    "qa": "downloads its dataset from the Hugging Face hub (needs the network and `datasets`)",
    "logic": "downloads its dataset from the Hugging Face hub (needs the network and `datasets`)",
    "eval": "downloads its dataset from the Hugging Face hub (needs the network and `datasets`)",
}
# Games that fetch data at reset, or that crash in gem-llm 0.1.0.
GAME_PROBLEMS = {
    "Wordle": "needs the nltk 'words' corpus, which it downloads at run time (network)",
    "Hangman": "needs the nltk 'words' corpus, which it downloads at run time (network)",
    "WordSearch": "needs the nltk 'words' corpus, which it downloads at run time (network)",
}
BROKEN_IDS = {
    "game:FifteenPuzzle-v0-random": "crashes in its constructor in gem-llm 0.1.0 (upstream bug)",
}
# Wrappers that call out to a retrieval server (SEARCH_URL): not usable offline.
NETWORK_WRAPPERS = ("search_tool",)


@dataclass(frozen=True)
class Wrapper:
    name: str
    kind: str  # "tool", "observation" or "tracking": GEM applies them in this order
    needs_tokenizer: bool


@lru_cache(maxsize=1)
def registry() -> dict[str, str]:
    """Every registered id -> its entry point ("module:Class"); empty without GEM."""
    root = package_dir(PACKAGE)
    tree = parse(root / "envs" / "__init__.py") if root is not None else None
    if tree is None:
        return {}
    constants = literal_assigns(tree)
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Expr):
            _register(node.value, {}, found)
        elif isinstance(node, ast.For):
            for bindings in _loop_bindings(node, constants):
                for stmt in node.body:
                    if isinstance(stmt, ast.Expr):
                        _register(stmt.value, bindings, found)
    return found


@lru_cache(maxsize=1)
def wrappers() -> dict[str, Wrapper]:
    """GEM's wrapper factory: name -> kind and whether it needs a tokenizer."""
    root = package_dir(PACKAGE)
    tree = parse(root / "wrappers" / "wrapper_factory.py") if root is not None else None
    if tree is None:
        return {}
    required = literal_assigns(tree).get("TOKENIZER_REQUIRED")
    needs_tokenizer = required if isinstance(required, list | tuple | set) else []
    factory: ast.Dict | None = None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "WRAPPER_FACTORY" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            factory = node.value
    if factory is None:
        return {}
    out: dict[str, Wrapper] = {}
    for key, value in zip(factory.keys, factory.values, strict=True):
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            name = key.value
            out[name] = Wrapper(name, _wrapper_kind(value), name in needs_tokenizer)
    return out


def check_env_id(env_id: str) -> None:
    """Raise ValueError unless `env_id` is registered and works on this machine (offline)."""
    known = registry()
    if not known:
        raise ValueError("GEM is not installed; install the extra: pip install -e '.[gem]'")
    if env_id not in known:
        raise ValueError(unknown_name("GEM environment id", env_id, sorted(known)))
    problem = offline_problem(env_id)
    if problem is not None:
        raise ValueError(f"GEM environment {env_id!r} cannot be used here: it {problem}")


def offline_problem(env_id: str) -> str | None:
    """Why this id cannot run on an offline machine, or None when it can."""
    if env_id in BROKEN_IDS:
        return BROKEN_IDS[env_id]
    family, _, rest = env_id.partition(":")
    if family in NETWORK_FAMILIES:
        return NETWORK_FAMILIES[family]
    if family == "game":
        game = rest.split("-", 1)[0]
        return GAME_PROBLEMS.get(game)
    return None


def check_wrappers(text: str) -> list[Wrapper]:
    """Parse a comma list of wrapper names; refuse unknown, offline-impossible or misordered."""
    known = wrappers()
    names = [n.strip() for n in text.split(",") if n.strip()] if text.strip() else []
    if names and not known:
        raise ValueError("GEM is not installed; install the extra: pip install -e '.[gem]'")
    chosen: list[Wrapper] = []
    for name in names:
        if name not in known:
            raise ValueError(unknown_name("GEM wrapper", name, sorted(known)))
        if name.startswith(NETWORK_WRAPPERS):
            raise ValueError(
                f"GEM wrapper {name!r} cannot be used here: it queries a retrieval server "
                "(SEARCH_URL) over the network"
            )
        chosen.append(known[name])
    order = {"tool": 0, "observation": 1, "tracking": 2}
    ranks = [order.get(w.kind, 1) for w in chosen]
    if ranks != sorted(ranks):
        raise ValueError(
            "GEM wrappers go in this order: tool wrappers, then one observation wrapper, then "
            f"episode_tracking; got {', '.join(names)}"
        )
    observation = [w.name for w in chosen if w.kind == "observation"]
    if len(observation) > 1:
        raise ValueError(f"use at most one observation wrapper; got {', '.join(observation)}")
    if len({w.name for w in chosen}) != len(chosen):
        raise ValueError(f"a wrapper is listed twice: {', '.join(names)}")
    return chosen


def check_env_kwargs(env_id: str, values: dict[str, Any]) -> None:
    """Refuse keyword arguments the environment's constructor does not take (GEM envs accept
    and silently ignore unknown ones, so a typo would otherwise go unnoticed)."""
    entry = registry().get(env_id)
    root = package_dir(PACKAGE)
    if not values or entry is None or root is None or ":" not in entry:
        return
    module, class_name = entry.split(":", 1)
    params = init_params(root, PACKAGE, module, class_name)
    if params is None:
        return
    for key in values:
        if key not in params:
            raise ValueError(
                unknown_name(
                    f"keyword for {env_id}",
                    key,
                    params,
                    hint=f" {class_name} takes: {', '.join(params)}.",
                )
            )


def _register(call: ast.expr, bindings: dict[str, Any], found: dict[str, str]) -> None:
    if not (isinstance(call, ast.Call) and _name(call.func) == "register" and len(call.args) >= 2):
        return
    env_id = _text(call.args[0], bindings)
    entry = call.args[1]
    if env_id is not None and isinstance(entry, ast.Constant) and isinstance(entry.value, str):
        found[env_id] = entry.value


def _loop_bindings(node: ast.For, constants: dict[str, object]) -> list[dict[str, Any]]:
    """The values a module-level `for` loop binds, for the loops GEM's registry uses."""
    if isinstance(node.iter, ast.Name):
        values = constants.get(node.iter.id)
    elif "DATASETS" in ast.unparse(node.iter):
        values = rg_catalog.names()  # `for name in rg.factory.DATASETS.keys()`
    else:
        try:
            values = ast.literal_eval(node.iter)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return []
    if not isinstance(values, list | tuple):
        return []
    out = []
    for value in values:
        if isinstance(node.target, ast.Name):
            out.append({node.target.id: value})
        elif isinstance(node.target, ast.Tuple) and isinstance(value, list | tuple):
            names = [t.id for t in node.target.elts if isinstance(t, ast.Name)]
            out.append(dict(zip(names, value, strict=False)))
    return out


def _text(node: ast.expr, bindings: dict[str, Any]) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                if value.value.id not in bindings:
                    return None
                parts.append(str(bindings[value.value.id]))
            else:
                return None
        return "".join(parts)
    return None


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _wrapper_kind(value: ast.expr) -> str:
    target = value.args[0] if isinstance(value, ast.Call) and value.args else value
    name = _name(target) or ""
    if name == "ToolEnvWrapper":
        return "tool"
    if name == "EpisodeTrackingWrapper":
        return "tracking"
    return "observation"
