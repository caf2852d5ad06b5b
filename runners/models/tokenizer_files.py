"""Tokenizer folders that load under transformers 4 and 5 alike.

transformers 5 saves `tokenizer_class: TokenizersBackend` (a class 4 lacks) and a list of
`extra_special_tokens` (4 wants a dict there, the list under `additional_special_tokens`).
Both versions load `PreTrainedTokenizerFast` from the same `tokenizer.json`, so a saved folder
is rewritten to name that: the Atropos interpreter (transformers 4) loads what ours writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

CONFIG_FILE = "tokenizer_config.json"
PORTABLE_CLASS = "PreTrainedTokenizerFast"
VERSION_5_ONLY_CLASSES = frozenset({"TokenizersBackend"})


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` as both versions read it (unchanged when it already is)."""
    out = dict(config)
    if out.get("tokenizer_class") in VERSION_5_ONLY_CLASSES:
        out["tokenizer_class"] = PORTABLE_CLASS
    extra = out.get("extra_special_tokens")
    if isinstance(extra, list):
        del out["extra_special_tokens"]
        known = list(out.get("additional_special_tokens") or [])
        out["additional_special_tokens"] = known + [t for t in extra if t not in known]
    return out


def make_portable(folder: Path) -> None:
    """Rewrite `folder`'s tokenizer config in place when it names transformers 5 only
    (atomically: a reader sees the old file or the new one)."""
    path = Path(folder) / CONFIG_FILE
    if not path.is_file():
        return  # no tokenizer saved there (a model folder holding only weights)
    config = json.loads(path.read_text(encoding="utf-8"))
    fixed = portable_config(config)
    if fixed == config:
        return
    partial = path.with_name(f"{CONFIG_FILE}.partial-{os.getpid()}")
    partial.write_text(json.dumps(fixed, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    partial.replace(path)
