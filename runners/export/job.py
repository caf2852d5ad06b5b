"""`python -m runners.export`: write one checkpoint as a Hugging Face folder, in its own process
(torch, peft and the Tinker SDK stay out of the server). The last stdout line is a JSON answer."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from core.checkpoint_check import CheckpointUnusable
from core.settings import Settings

# Exit codes the server maps to answers (anything else is a failed export).
EXIT_UNUSABLE, EXIT_EXISTS = 3, 4
ROLLOUTS_FILE = "rollouts.jsonl"


class DestinationTaken(Exception):
    """The destination holds files and the caller did not ask to replace them."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    card: dict[str, Any] = json.loads(args.card)
    settings = Settings()
    out = Path(args.out)
    answer: dict[str, Any] = {}

    def build_all(tmp: Path) -> None:
        answer.update(_export(args, card, settings, tmp))
        if args.rollouts:  # the run's recorded episodes, written by the server
            shutil.copyfile(args.rollouts, tmp / ROLLOUTS_FILE)

    try:
        answer["files"] = publish(out, build_all, args.overwrite)
    except CheckpointUnusable as exc:
        return _answer({"ok": False, "error": str(exc)}, EXIT_UNUSABLE)
    except DestinationTaken as exc:
        return _answer({"ok": False, "error": str(exc)}, EXIT_EXISTS)
    except Exception as exc:  # the server reports it; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        return _answer({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, 1)
    return _answer({"ok": True, **answer}, 0)


def _export(
    args: argparse.Namespace, card: dict[str, Any], settings: Settings, tmp: Path
) -> dict[str, Any]:
    """Write the checkpoint into `tmp` in the asked format; the answer's facts about it."""
    if args.tinker_state:
        from runners.export.tinker import export_external

        base, external = export_external(
            args.tinker_state, args.name, tmp, card, settings.export_timeout_s
        )
        return {"base_model": base, "format": "tinker-external", "external_path": external}
    if args.merged:
        from runners.export.local import export_merged

        return {
            "base_model": export_merged(Path(args.sampler), tmp, card, settings.models_dir),
            "format": "hf-merged",
        }
    from runners.export.local import export_adapter

    return {
        "base_model": export_adapter(Path(args.sampler), tmp, card, settings.models_dir),
        "format": "peft-lora",
    }


def publish(out: Path, build: Callable[[Path], None], overwrite: bool) -> list[str]:
    """Build in a temp folder beside `out`, then rename it into place: `out` is never half
    written, and a failed export leaves whatever was there before. The files, relative."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _refuse_taken(out, overwrite)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-tmp-", dir=out.parent))
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o777 & ~mask)  # mkdtemp makes it private; an export is for sharing
    old: Path | None = None
    try:
        build(tmp)
        files = sorted(p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file())
        _refuse_taken(out, overwrite)
        if out.exists():
            old = out.parent / f".{out.name}-old-{tmp.name.rsplit('-', 1)[-1]}"
            os.rename(out, old)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return files


def _refuse_taken(out: Path, overwrite: bool) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise DestinationTaken(f"{out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise DestinationTaken(f"{out} exists and is not empty")


def _answer(value: dict[str, Any], code: int) -> int:
    print(json.dumps(value), flush=True)
    return code


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m runners.export", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--sampler", help="a local sampler checkpoint folder")
    source.add_argument("--tinker-state", help="a Tinker state checkpoint (tinker://...)")
    parser.add_argument("--out", required=True, help="the folder to write")
    parser.add_argument("--merged", action="store_true", help="merge the adapter into the base")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty --out")
    parser.add_argument("--name", default="export", help="the Tinker external weights' name")
    parser.add_argument("--card", default="{}", help="the run's facts for README.md (JSON)")
    parser.add_argument("--rollouts", help=f"a JSON lines file to add as {ROLLOUTS_FILE}")
    return parser
