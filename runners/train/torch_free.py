"""A run whose model is not in its own process (the engine host's, or hosted Tinker's) starts
without torch: hidden before tinker and transformers are imported, both work without it, and
the process holds about a quarter of a gigabyte less (benchmarks/README.md, issue 43).

    run's spec -> model in this process? -> yes: nothing hidden
                      | no
               torch hidden -> the run's environment files imported -> fine: go on, torch-free
                                       | one fails (it imports torch, or a model of transformers)
               this process started again with torch (RLCS_RUNNER_TORCH=true), before anything
               is recorded
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from core.run_folder import RunFolder
from core.settings import Settings
from core.spec import RunSpec

TORCH_WANTED = "RLCS_RUNNER_TORCH"  # Settings.runner_torch
_NO_ADVICE = "TRANSFORMERS_NO_ADVISORY_WARNINGS"


def prepare(argv: list[str]) -> None:
    """Hide torch when this run needs none; called before anything imports tinker."""
    settings = Settings()
    if settings.runner_torch or "torch" in sys.modules:
        return
    spec = _spec(settings, argv)
    if spec is None or _model_in_this_process(spec, settings):
        return
    sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` fails, find_spec is None
    _import_transformers_quietly()
    try:
        _import_environments(spec)
    except Exception as exc:  # noqa: BLE001  # with torch, it imports or fails as it always did
        print(
            f"the run's environment did not import without torch ({type(exc).__name__}: "
            f"{exc}): this process starts again with torch",
            flush=True,
        )
        os.execve(
            sys.executable,
            [sys.executable, *sys.orig_argv[1:]],
            {**os.environ, TORCH_WANTED: "true"},
        )
    print("the run's model is not in this process, which runs without torch", flush=True)


def torch_hidden() -> bool:
    """Whether this process runs without torch (`prepare` hid it)."""
    return "torch" in sys.modules and sys.modules["torch"] is None


def advice(exc: BaseException) -> str | None:
    """What to do when `exc` is an import of torch (or a part of it) that failed because this
    process hides it; None for any other error."""
    hidden = isinstance(exc, ImportError) and (exc.name or "").split(".")[0] == "torch"
    if not (hidden and torch_hidden()):
        return None
    return (
        "torch was imported in the middle of the run, and this run's process runs without "
        "torch (its model is not in it): import torch at the top of the environment's file "
        "(the run then starts with it), or set the run's engine to private"
    )


def _import_transformers_quietly() -> None:
    """transformers advises at import that models need torch: true, and not this run's case."""
    before = os.environ.get(_NO_ADVICE)
    os.environ[_NO_ADVICE] = "1"
    try:
        import transformers  # noqa: F401
    finally:
        if before is None:
            del os.environ[_NO_ADVICE]
        else:
            os.environ[_NO_ADVICE] = before


def _spec(settings: Settings, argv: list[str]) -> RunSpec | None:
    """The run's spec as `runners.train.loop.main` will read it; None where it cannot be read
    (main then reports why, with torch as usual)."""
    try:
        if settings.run_spec is not None:
            return RunSpec.model_validate_json(settings.run_spec)
        run_dir = argv[argv.index("--run-dir") + 1]
        return RunFolder(Path(run_dir).resolve()).spec()
    except (ValueError, IndexError, OSError):
        return None


def _model_in_this_process(spec: RunSpec, settings: Settings) -> bool:
    """A local run on a private engine holds its model here; the engine host's and hosted
    Tinker's runs do not (resolved as runners.backends.factory resolves them)."""
    from runners.backends.factory import resolve_backend, run_engine

    try:
        backend = resolve_backend(str(spec.config.get("backend", "auto")), settings)
        where = run_engine(str(spec.config.get("engine", "auto")), settings)
    except ValueError:
        return True
    return backend == "local" and where == "private"


def _import_environments(spec: RunSpec) -> None:
    """Our environments run in this process (Atropos and verifiers ones in their own), so
    what their files import at the top decides whether torch is needed."""
    from environments.support.loader import load_env_class

    for source in spec.sources().values():
        if source.framework == "rlcs":
            load_env_class(Path(source.env_file), source.env_class)
