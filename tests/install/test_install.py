"""The Dockerfile's install steps run in a fresh folder, serving /health from it
(RLCS_TEST_INSTALL=1 or CI=true)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from core.settings import PROJECT_ROOT
from tests.support.live_server import free_port
from tests.test_install import DOCKERFILE, dockerfile_copies


def _install_wanted() -> bool:
    return os.environ.get("RLCS_TEST_INSTALL") == "1" or os.environ.get("CI") == "true"


@pytest.mark.timeout(3600)
@pytest.mark.skipif(not _install_wanted(), reason="set RLCS_TEST_INSTALL=1 (CI=true runs it)")
def test_dockerfile_steps_install_a_working_server(tmp_path: Path) -> None:
    # What `docker build` would do, without docker: the same COPY set into a fresh folder, the
    # same install steps there, then the server from that folder (WORKDIR /app).
    app = tmp_path / "app"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}
    env.pop("RLCS_API_TOKEN", None)
    env.pop("PYTHONPATH", None)
    try:
        _copy_like_docker(app)
        for argv, step_env in dockerfile_install_steps(app):
            subprocess.run(argv, cwd=app, env={**env, **step_env}, check=True, timeout=3000)
        assert not list((app / "wheels").glob("*.whl"))  # torch's wheel is not left in the image
        python = str(app / ".venv" / "bin" / "python")
        subprocess.run([python, "-c", "import server.app"], cwd=app, env=env, check=True)
        models = {"RLCS_MODELS_DIR": str(app / "models")}  # the image's ENV
        health = _serve_and_ask_health(python, app, {**env, **models}, tmp_path)
        assert health["status"] == "ok" and health["environments"] >= 1
        atropos = str(app / ".venv-atropos" / "bin" / "python")
        subprocess.run([atropos, "-c", "import atroposlib.envs.base"], env=env, check=True)
    finally:
        shutil.rmtree(app / ".venv", ignore_errors=True)  # GBs; pytest keeps tmp dirs around
        shutil.rmtree(app / ".venv-atropos", ignore_errors=True)


def dockerfile_install_steps(app: Path) -> list[tuple[list[str], dict[str, str]]]:
    """The Dockerfile's RUN commands up to the user's creation, as they run here, each with the
    variables its ENV lines set before it (paths under /app moved to `app`): `python` is this
    interpreter's base (its pip reads this machine's config, which finds the CPU build of
    torch: PyTorch's CPU index is not reachable from here, nor from CI) until an ENV puts the
    image's venv first on PATH, then that venv's; `uv` the one beside this interpreter,
    installed by the same pin as the image's."""
    python = str(Path(sys.base_prefix) / "bin" / "python3")
    uv = str(Path(sys.executable).with_name("uv"))
    steps: list[tuple[list[str], dict[str, str]]] = []
    step_env: dict[str, str] = {}
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    for line in text.splitlines():
        if line.startswith("RUN useradd"):
            break
        if line.startswith("ENV "):
            for name, value in (pair.split("=", 1) for pair in shlex.split(line[4:])):
                if name == "PATH" and value.startswith("/app/.venv/bin:"):
                    python = str(app / ".venv" / "bin" / "python")
                elif name.startswith("RLCS_"):
                    step_env[name] = value.replace("/app", str(app), 1)
            continue
        if not line.startswith("RUN "):
            continue
        for command in line[4:].split("&&"):
            argv = shlex.split(command)
            if argv[:2] == ["pip", "install"]:
                continue  # uv itself
            if "--index-url" in argv:
                at = argv.index("--index-url")
                del argv[at : at + 2]
            replaced = {"python": python, "uv": uv}
            steps.append(([replaced.get(argv[0], argv[0]), *argv[1:]], dict(step_env)))
    return steps


def _copy_like_docker(app: Path) -> None:
    app.mkdir()
    for source in dockerfile_copies():
        src, dst = PROJECT_ROOT / source, app / source
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(src, dst, ignore=ignore)
        else:
            shutil.copy2(src, dst)


def _serve_and_ask_health(
    python: str, app: Path, env: dict[str, str], tmp_path: Path
) -> dict[str, Any]:
    port = free_port()
    server_env = {
        **env,
        "RLCS_HOST": "127.0.0.1",
        "RLCS_PORT": str(port),
        "RLCS_VAR_DIR": str(tmp_path / "var"),
    }
    log_path = tmp_path / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [python, "-m", "server"], cwd=app, env=server_env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                answer = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
            except httpx.HTTPError:
                time.sleep(0.2)
                continue
            assert answer.status_code == 200, answer.text
            return answer.json()
        raise AssertionError(
            f"no /health from the installed server: {log_path.read_text()[-3000:]}"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=30)
