"""The runner's end of a verifiers environment's driver (envside/drive.py, in the verifiers
interpreter): started in the environment's folder with the face's URL and key, waited for
until the environment loaded, then asked for groups (`roll`), several at once; each answer
resolves its request's future on the runner's event loop. A driver that exits fails what is
still asked of it with its log's tail; it ends with its owner (end of its input).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from itertools import count
from pathlib import Path
from typing import Any, Literal

from core import procs
from core.atropos import offline_environment
from core.child import Child
from core.failures import RunFailure
from core.run_folder import tail_lines
from core.settings import Settings
from core.spec import EnvSource
from core.verifiers import DRIVE_SCRIPT, KEY_VARIABLE, V0_ENTRY, Generation
from core.verifiers_wire import DRIVER_LINE, DriverLine, Failed, Group, Ready, Roll


class EnvironmentFailed(RunFailure):
    """The environment did not load, or its driver died or failed a group (says why)."""

    category = "environment"


@dataclass(frozen=True)
class DriverConfig:
    """What the driver is told (written to a file in the run's folder; no key in it)."""

    folder: Path  # the environment's folder (its pyproject.toml's)
    env_id: str
    generation: Generation
    env_args: dict[str, Any]
    base_url: str  # the face's, with /v1
    model: str
    tokenizer_dir: str  # v1: what verifiers' renderer tokenizes with
    seed: int

    @classmethod
    def of(
        cls,
        source: EnvSource,
        env_args: dict[str, Any],
        base_url: str,
        model: str,
        seed: int,
        models_dir: Path,
    ) -> DriverConfig:
        """The environment `source` names, by the id verifiers would import it by (its
        module's name: `load_environment("reverse-word")` imports `reverse_word` too)."""
        from runners.models.loading import tokenizer_folder

        module_file = Path(source.env_file)
        package = module_file.name == "__init__.py"
        return cls(
            folder=module_file.parent.parent if package else module_file.parent,
            env_id=module_file.parent.name if package else module_file.stem,
            generation="v0" if source.env_class == V0_ENTRY else "v1",
            env_args=env_args,
            base_url=base_url,
            model=model,
            tokenizer_dir=str(tokenizer_folder(model, models_dir)),
            seed=seed,
        )

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        body = {**self.__dict__, "folder": str(self.folder)}
        path.write_text(json.dumps(body, indent=2))
        return path


@dataclass
class Driver:
    child: Child[DriverLine]
    loop: asyncio.AbstractEventLoop
    ready: asyncio.Future[Ready]
    pending: dict[int, asyncio.Future[Group]] = field(default_factory=dict)
    ids: count[int] = field(default_factory=count)

    @classmethod
    def start(cls, settings: Settings, config: DriverConfig, work: Path, key: str) -> Driver:
        python = settings.verifiers_python
        if not Path(python).is_file():
            raise EnvironmentFailed(
                f"the verifiers interpreter {python} does not exist: run `make install` (it "
                "makes .venv-verifiers), or point RLCS_VERIFIERS_PYTHON at a Python with "
                "verifiers 0.3"
            )
        loop = asyncio.get_running_loop()
        path = config.write(work / "driver.json")
        env = {**offline_environment(settings.inspector_environment()), **harness_home(settings)}
        env[KEY_VARIABLE] = key
        ready: asyncio.Future[Ready] = loop.create_future()
        driver: Driver | None = None

        # Run on the loop, so after `start` returned and `driver` is set.
        def on_message(line: DriverLine) -> None:
            loop.call_soon_threadsafe(lambda: driver_of().settle(line))

        def on_end(code: int) -> None:
            loop.call_soon_threadsafe(lambda: driver_of().ended(code))

        def on_invalid(why: str) -> None:  # an answer is lost: nothing would ever settle it
            loop.call_soon_threadsafe(lambda: driver_of().fail_all(why))

        def driver_of() -> Driver:
            assert driver is not None
            return driver

        child: Child[DriverLine] = Child(
            "the verifiers environment's driver",
            [python, str(DRIVE_SCRIPT), str(path)],
            DRIVER_LINE,
            cwd=config.folder,
            env=env,
            log_path=work / "driver.log",
            on_message=on_message,
            on_end=on_end,
            on_invalid=on_invalid,
        )
        driver = cls(child, loop, ready)
        return driver

    async def wait_ready(self, timeout_s: float) -> Ready:
        try:
            return await asyncio.wait_for(asyncio.shield(self.ready), timeout_s)
        except TimeoutError:
            raise EnvironmentFailed(
                f"the environment did not load within {timeout_s:g} s "
                f"(RLCS_VERIFIERS_START_TIMEOUT_S). {self._tail()}"
            ) from None

    async def roll(
        self,
        example: int,
        size: int,
        sampling: dict[str, Any],
        split: Literal["train", "eval"] = "train",
    ) -> Group:
        """One group: `size` rollouts of the split's example (wrapped), scored."""
        await self.ready
        request = Roll(
            id=next(self.ids), example=example, split=split, size=size, sampling=sampling
        )
        future: asyncio.Future[Group] = self.loop.create_future()
        self.pending[request.id] = future
        if not await asyncio.to_thread(self.child.send, request):
            self.pending.pop(request.id, None)
            raise EnvironmentFailed(f"the environment's driver is gone. {self._tail()}")
        return await future

    def settle(self, line: DriverLine) -> None:
        match line:
            case Ready():
                if not self.ready.done():
                    self.ready.set_result(line)
            case Group(id=request_id):
                future = self.pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(line)
            case Failed(id=None, error=error):
                self.fail_all(f"the environment failed to load: {error}")
            case Failed(id=int() as request_id, error=error):
                future = self.pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_exception(EnvironmentFailed(f"the environment failed: {error}"))

    def ended(self, code: int) -> None:
        self.fail_all(
            f"the environment's driver ended ({procs.describe_exit(code)}). {self._tail()}"
        )

    def fail_all(self, why: str) -> None:
        """What is asked of the driver fails with `why` (it will not be answered)."""
        if not self.ready.done():
            self.ready.set_exception(EnvironmentFailed(why))
        for future in self.pending.values():
            if not future.done():
                future.set_exception(EnvironmentFailed(why))
        self.pending.clear()

    def _tail(self) -> str:
        path = self.child.log_path
        lines = tail_lines(path, 12) if path is not None else []
        return "Last lines of its log:\n" + "\n".join(lines) if lines else ""

    def stop(self) -> None:
        self.child.stop()


# The null harness is a PEP 723 script whose dependencies are unpinned (openai, mcp, httpx,
# tenacity), resolved afresh for each new environment: openai 3.63 (uploaded 2026-12-03) with
# httpx2 2.17 failed every rollout ("Invalid timeout ... got <class 'httpx.Timeout'>"). It
# resolves as of this moment instead, as a lock would (openai 3.60, httpx2 2.16.2).
HARNESS_RESOLVED_AS_OF = "2026-11-27T00:00:00Z"


def harness_home(settings: Settings) -> dict[str, str]:
    """Where verifiers' v1 runtime prepares its harness (`pip install --user uv`, then `uv sync
    --script`, into $HOME): a folder of the server's, not the user's home; the package caches
    stay the user's, so that what was fetched once is not fetched again. The harness's script
    resolves as of `HARNESS_RESOLVED_AS_OF` unless the user's UV_EXCLUDE_NEWER says otherwise."""
    home = settings.var_dir / "verifiers" / "home"
    home.mkdir(parents=True, exist_ok=True)
    user = Path(os.environ.get("HOME") or Path.home())
    return {
        "HOME": str(home),
        "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR") or str(user / ".cache" / "uv"),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR") or str(user / ".cache" / "pip"),
        "UV_EXCLUDE_NEWER": os.environ.get("UV_EXCLUDE_NEWER") or HARNESS_RESOLVED_AS_OF,
    }


def sampling_args(max_tokens: int, temperature: float, top_p: float, top_k: int) -> dict[str, Any]:
    """What verifiers' client sends with each chat request: prime-rl's training arguments
    (logprobs and vLLM's token ids), the run's sampling fields."""
    extra: dict[str, Any] = {"return_token_ids": True}
    if top_k != -1:
        extra["top_k"] = top_k
    return {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "logprobs": True,
        "extra_body": extra,
    }
