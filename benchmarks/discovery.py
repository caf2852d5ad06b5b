"""Listing N environment files by AST scan against importing them; the API server's start-up
time, resident memory and heavy-module check, each beside a baseline measured in the same run.
Run from the repo root: .venv/bin/python benchmarks/discovery.py [--files 1000]"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from string import Template

import httpx

from core.settings import PROJECT_ROOT
from server.environments import discovery
from server.environments.catalog import Catalog
from tests.support.live_server import free_port, stop_process

HEAVY = ("torch", "transformers", "tinker", "wandb", "peft", "gem", "openreward")
STARTS = 3

# About 40 lines, shaped like environments/arithmetic.py: a Config, a SingleTurnEnv subclass
# with a docstring and a name, get_task/score and a helper. Only the numbers vary per file.
ENV_TEMPLATE = Template('''\
"""Generated benchmark environment $i: reverse a list of $noun words (single-turn)."""

from __future__ import annotations

import random

from pydantic import Field

from environments.base import EnvConfig, SingleTurnEnv, Split, Task, Unscorable

_EVAL_SEED_OFFSET = $offset
_WORDS = ($words)


class Gen${i}Config(EnvConfig):
    word_count: int = Field($count, ge=1, le=64, description="Words per question")
    case_sensitive: bool = Field(False, description="Compare answers with case")


class Gen${i}Env(SingleTurnEnv):
    """Reverse a list of $noun words; the answer is the words in reverse order."""

    name = "gen_$i"
    Config = Gen${i}Config
    config: Gen${i}Config

    def get_task(self, seed: int, split: Split = "train") -> Task:
        rng = random.Random(seed + (_EVAL_SEED_OFFSET if split == "eval" else 0))
        words = [rng.choice(_WORDS) for _ in range(self.config.word_count)]
        prompt = f"Reverse these words: {' '.join(words)}. Answer with the words only."
        return Task(prompt=prompt, answer=" ".join(reversed(words)))

    def score(self, prompt: str, response: str, task: Task | None = None) -> float:
        if task is None:
            raise Unscorable("this environment scores only its own tasks")
        expected, given = str(task.answer), _normalise(response)
        if not self.config.case_sensitive:
            expected, given = expected.lower(), given.lower()
        return 1.0 if given == expected else 0.0


def _normalise(text: str) -> str:
    return " ".join(text.split())
''')
NOUNS = ("animal", "colour", "fruit", "city", "tool", "planet", "river", "metal")
VOCAB = ("alpha", "bravo", "delta", "echo", "lima", "oscar", "romeo", "tango", "zulu", "kilo")


def write_envs(folder: Path, count: int) -> None:
    for n in range(count):
        i = f"{n:05d}"
        words = ", ".join(f'"{VOCAB[(n + k) % len(VOCAB)]}{k}"' for k in range(6))
        text = ENV_TEMPLATE.substitute(
            i=i, noun=NOUNS[n % len(NOUNS)], offset=1_000_003 + n, words=words, count=3 + n % 5
        )
        (folder / f"gen_{i}.py").write_text(text)


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def import_all(folder: Path, tag: str) -> int:
    """Import every file under a name never used before, so nothing comes from sys.modules."""
    names = []
    for path in sorted(folder.glob("*.py")):
        name = f"bench_env_{tag}_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        # Registered before executing, as environments/support/loader.py does (pydantic needs it).
        sys.modules[name] = module
        spec.loader.exec_module(module)
        names.append(name)
    for name in names:
        del sys.modules[name]
    return len(names)


def bench_discovery(files: int) -> list[tuple[str, float, str]]:
    # Imported before timing: both sides then pay only for the environment files themselves,
    # which favours importing (a real first import would also load pydantic and the base).
    import environments.base  # noqa: F401

    with tempfile.TemporaryDirectory(prefix="rlcs-bench-envs-") as tmp:
        folder = Path(tmp)
        write_envs(folder, files)
        # The page cache is warm for every variant: the files were just written.
        found = discovery.scan([folder])
        assert len(found) == files, f"scan found {len(found)} of {files} environments"
        assert all(f.syntax_error is None for f in found)

        cold = []
        for _ in range(STARTS):
            discovery._cache.clear()
            cold.append(timed(lambda: discovery.scan([folder])))
        warm = [timed(lambda: discovery.scan([folder])) for _ in range(STARTS)]
        catalog = Catalog([folder], PROJECT_ROOT)
        catalog_warm = [timed(catalog.list) for _ in range(STARTS)]
        # First import compiles the source and writes __pycache__; later ones read the .pyc.
        import_first = timed(lambda: import_all(folder, "first"))
        # Once only: at ~5 ms a file it dominates the run time, and varies little.
        import_again = timed(lambda: import_all(folder, "again"))

    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    again_s = import_again
    return [
        ("scan, cold (AST parse of every file)", cold_s, "1.00x (baseline)"),
        ("scan, warm (mtime cache hit)", warm_s, f"{warm_s / cold_s:.3f}x"),
        ("Catalog.list(), warm (GET /environments)", statistics.median(catalog_warm), ""),
        ("import all, first (compile + write .pyc)", import_first, f"{import_first / cold_s:.1f}x"),
        ("import all, again (from .pyc, 1 run)", again_s, f"{again_s / cold_s:.1f}x"),
    ]


# Start-up ----------------------------------------------------------------------------------

# The smallest server built from the same stack, started and measured the same way.
BASELINE_SERVER = """
import sys, fastapi, sqlmodel, uvicorn
app = fastapi.FastAPI()
@app.get("/health")
def health() -> dict:
    return {"status": "ok"}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def child_env(var_dir: Path, port: int) -> dict[str, str]:
    env = {**os.environ, "RLCS_VAR_DIR": str(var_dir), "RLCS_HOST": "127.0.0.1"}
    env["RLCS_PORT"] = str(port)
    # A key in the environment would only change the reported backend; keep the run neutral.
    for key in ("TINKER_API_KEY", "WANDB_API_KEY", "OPENREWARD_API_KEY", "RLCS_API_TOKEN"):
        env.pop(key, None)
    return env


def proc_status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def start_and_measure(argv: list[str], port: int, env: dict[str, str]) -> tuple[float, int, str]:
    """(seconds until GET /health answers 200, VmRSS KiB then, mapped heavy libraries)."""
    url = f"http://127.0.0.1:{port}/health"
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode() if proc.stderr else ""
                raise RuntimeError(f"{argv[:3]} exited {proc.returncode}: {err[-2000:]}")
            if time.perf_counter() - start > 30:
                raise RuntimeError(f"{argv[:3]} did not answer /health within 30 s")
            try:
                if httpx.get(url, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.01)
        elapsed = time.perf_counter() - start
        rss = proc_status_kib(proc.pid, "VmRSS")
        # Native libraries of heavy packages show up in the memory map if anything loaded them.
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        mapped = sorted({m for m in ("libtorch", "libcuda", "libcudart") if m in maps})
        return elapsed, rss, ",".join(mapped)
    finally:
        stop_process(proc)
        if proc.stderr:
            proc.stderr.close()


def heavy_modules(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


HEAVY_AFTER_IMPORT = f"""
import json, sys
import server.app
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""

# The lifespan (services, supervisor) and a few requests, in-process, with nothing added to
# the server: what a served process would have loaded after its first answers.
HEAVY_AFTER_REQUESTS = f"""
import json, sys, tempfile
from pathlib import Path
from fastapi.testclient import TestClient
from server.app import create_app
from core.settings import Settings
with tempfile.TemporaryDirectory() as tmp:
    with TestClient(create_app(Settings(var_dir=Path(tmp), api_token=None))) as client:
        for path in ("/health", "/environments", "/runs", "/config"):
            client.get(path)
print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))
"""


def bench_startup() -> dict[str, object]:
    server_times, server_rss, base_times, base_rss, mapped = [], [], [], [], set()
    with tempfile.TemporaryDirectory(prefix="rlcs-bench-start-") as tmp:
        # Alternated so that any drift of the machine hits both sides alike.
        for n in range(STARTS):
            port = free_port()
            env = child_env(Path(tmp) / f"var{n}", port)
            t, rss, libs = start_and_measure([sys.executable, "-m", "server"], port, env)
            server_times.append(t)
            server_rss.append(rss)
            mapped.update(filter(None, libs.split(",")))
            port = free_port()
            argv = [sys.executable, "-c", BASELINE_SERVER, str(port)]
            t, rss, _ = start_and_measure(argv, port, child_env(Path(tmp) / "base", port))
            base_times.append(t)
            base_rss.append(rss)
    return {
        "server_s": statistics.median(server_times),
        "server_rss_mib": statistics.median(server_rss) / 1024,
        "base_s": statistics.median(base_times),
        "base_rss_mib": statistics.median(base_rss) / 1024,
        "server_all_s": server_times,
        "mapped": sorted(mapped),
        "heavy_import": heavy_modules(HEAVY_AFTER_IMPORT),
        "heavy_requests": heavy_modules(HEAVY_AFTER_REQUESTS),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--files", type=int, default=1000, help="environment files to generate")
    args = parser.parse_args()
    print(
        f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.python_implementation()} "
        f"{platform.python_version()}, {os.cpu_count()} CPU cores, "
        f"load average {os.getloadavg()[0]:.1f}"
    )

    print(f"\nListing {args.files} environment files (~40 lines each), median of {STARTS}")
    rows = bench_discovery(args.files)
    print(f"  {'what':<44} {'total ms':>9} {'us/file':>8}  vs cold scan")
    for what, seconds, ratio in rows:
        per_file = seconds / args.files * 1e6
        print(f"  {what:<44} {seconds * 1e3:>9.1f} {per_file:>8.1f}  {ratio}")
    cold_s, warm_s, again_s = rows[0][1], rows[1][1], rows[4][1]
    print(
        f"  importing (from .pyc) takes {again_s / cold_s:.1f}x a cold scan "
        f"and {again_s / warm_s:.0f}x a warm scan"
    )

    print(f"\nServer start-up (python -m server until GET /health = 200), median of {STARTS}")
    s = bench_startup()
    print(f"  {'process':<44} {'start s':>9} {'RSS MiB':>8}")
    print(f"  {'python -m server':<44} {s['server_s']:>9.2f} {s['server_rss_mib']:>8.1f}")
    base = "baseline: bare FastAPI+sqlmodel+uvicorn app"
    print(f"  {base:<44} {s['base_s']:>9.2f} {s['base_rss_mib']:>8.1f}")
    print(
        f"  {'ratio server / baseline':<44} {s['server_s'] / s['base_s']:>8.2f}x "
        f"{s['server_rss_mib'] / s['base_rss_mib']:>7.2f}x"
    )
    runs = ", ".join(f"{t:.2f}" for t in s["server_all_s"])  # type: ignore[attr-defined]
    print(f"  server start-ups (s): {runs}")
    print(f"\nHeavy modules ({', '.join(HEAVY)}) loaded:")
    checks = [
        ("sys.modules after `import server.app`", s["heavy_import"]),
        ("sys.modules after lifespan + 4 GETs", s["heavy_requests"]),
        ("libtorch/libcuda in the served process's maps", s["mapped"]),
    ]
    for what, found in checks:
        print(f"  {what:<46} {found or 'none'}")


if __name__ == "__main__":
    main()
