"""Put the CPU build of torch into wheels/, where uv finds it (pyproject's tool.uv.find-links).

    python scripts/torch_wheel.py [PIP OPTIONS]           the build uv.lock names (make install)
    python scripts/torch_wheel.py --newest [PIP OPTIONS]  the newest pyproject allows (make lock)

pip fetches it from wherever pip is set to look: a machine whose pip config has the wheel
(find-links) needs no option; the Dockerfile passes --index-url https://download.pytorch.org/whl/cpu.
PyPI's Linux torch is the CUDA build (GBs of nvidia packages), which this refuses.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEELS = ROOT / "wheels"


def locked() -> tuple[str, list[str]]:
    """torch's version in uv.lock and the wheel files it names."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    torch = next(p for p in lock["package"] if p["name"] == "torch")
    return torch["version"], [Path(w["path"]).name for w in torch.get("wheels", []) if "path" in w]


def declared() -> str:
    """pyproject's requirement on torch, e.g. `torch>=2.5,<2.14`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return next(d for d in project["dependencies"] if d.replace(" ", "").startswith("torch"))


def download(requirement: str, pip_options: list[str]) -> list[Path]:
    """`pip download` of torch alone into wheels/; the torch wheels there afterwards."""
    WHEELS.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    argv += ["--only-binary=:all:", "--dest", str(WHEELS), *pip_options, requirement]
    subprocess.run(argv, check=True)
    return sorted(WHEELS.glob("torch-*.whl"))


def main(argv: list[str]) -> int:
    newest = "--newest" in argv
    pip_options = [a for a in argv if a != "--newest"]
    if newest:
        for old in WHEELS.glob("torch-*.whl"):
            old.unlink()  # the lock is to see only the build fetched now
        found = download(declared(), pip_options)
        if not found or any("+cpu" not in wheel.name for wheel in found):
            for wheel in found:
                wheel.unlink()
            print(
                f"pip found no CPU build of {declared()} (got {[w.name for w in found]}); give "
                "it PyTorch's CPU index: --index-url https://download.pytorch.org/whl/cpu",
                file=sys.stderr,
            )
            return 1
        print(f"wheels/{found[-1].name}")
        return 0
    version, files = locked()
    if files and all((WHEELS / name).exists() for name in files):
        return 0
    download(f"torch=={version}", pip_options)
    missing = [name for name in files if not (WHEELS / name).exists()]
    if missing or not files:
        print(
            f"uv.lock names {files or 'no wheel file'} for torch {version}; pip fetched "
            f"{[w.name for w in WHEELS.glob('torch-*.whl')]}. Re-lock with `make lock`.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
