"""The package layers: core at the bottom, then environments, then server and runners side by
side; cli stands alone; no two modules on an import cycle. The rules are import-linter
contracts in pyproject.toml: here they run, a planted violation of each is caught (inside a
function, where a reader of top-level imports would miss it), and importing every module in a
clean interpreter checks once more what actually loads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
OURS = ("core", "environments", "server", "runners", "cli")
# What each package may load of ours (itself included), for the clean-interpreter check.
ALLOWED = {
    "core": {"core"},
    "environments": {"core", "environments"},
    "runners": {"core", "environments", "runners"},
}


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` on the tree at `root` (its pyproject.toml, its packages)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=root,
        env={**os.environ, "COLUMNS": "1000"},  # one line per import chain, however long
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contracts_hold() -> None:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert f"Contracts: {len(contracts['contracts'])} kept, 0 broken." in result.stdout


# (the contract, the module that gets a function-level import, the import, what is reported)
PLANTED = [
    (
        "layers",
        "core/settings.py",
        "from server.app import create_app",
        "core.settings -> server.app",
    ),
    ("layers", "environments/base.py", "import runners.train.loop", "environments.base -> runners"),
    ("layers", "server/runs/views.py", "import runners.train.loop", "server.runs.views -> runners"),
    ("layers", "runners/train/report.py", "import server.errors", "runners.train.report -> server"),
    ("cli-alone", "cli/output.py", "import core.settings", "cli.output -> core.settings"),
    ("nothing-imports-cli", "runners/train/report.py", "import cli.main", "report -> cli.main"),
    (
        "routes-mounted-only",
        "server/mcp/tools.py",
        "from server.health.routes import health",
        "server.mcp.tools -> server.health.routes",
    ),
    (
        "container-for-faces",
        "server/runs/views.py",
        "from server.container import Services",
        "server.runs.views -> server.container",
    ),
    (
        "tinker-api-imports",
        "server/tinker_api/rest.py",
        "import server.runs.service",
        "server.tinker_api.rest -> server.runs.service",
    ),
    (
        "engine-wings-apart",
        "runners/engine/sample/selection.py",
        "import runners.engine.train.losses",
        "runners.engine.sample.selection -> runners.engine.train.losses",
    ),
    ("acyclic", "core/models.py", "import core.lifecycle", "core.lifecycle -> core.models ->"),
]


@pytest.mark.parametrize(("contract", "module", "statement", "reported"), PLANTED)
def test_a_planted_import_inside_a_function_breaks_its_contract(
    tmp_path: Path, contract: str, module: str, statement: str, reported: str
) -> None:
    for package in OURS:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=_not_python)
    shutil.copy2(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "tests" / "support").mkdir(parents=True)
    for name in ("__init__.py", "support/__init__.py", "support/import_contracts.py"):
        shutil.copy2(ROOT / "tests" / name, tmp_path / "tests" / name)
    assert lint_imports(tmp_path).returncode == 0  # the copy holds, as the tree does

    with (tmp_path / module).open("a") as source:
        source.write(f"\n\ndef _planted() -> None:\n    {statement}\n")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-2000:]
    broken = _broken_section(result.stdout, contract)
    assert reported in broken, result.stdout[-3000:]


def _not_python(folder: str, names: list[str]) -> list[str]:
    return [n for n in names if not n.endswith(".py") and not (Path(folder) / n).is_dir()]


def _broken_section(report: str, contract: str) -> str:
    """The part of lint-imports' report that explains why `contract` is broken."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    name = next(c["name"] for c in contracts["contracts"] if c["id"] == contract)
    assert f"{name} BROKEN" in report, report[-3000:]
    explained = report.split("Broken contracts", 1)[1]
    section = explained.split(f"{name}\n", 1)[1]
    return section.split(" BROKEN", 1)[0] if " BROKEN" in section else section


def modules(package: str) -> list[str]:
    """Every module of `package` but `python -m` entry points (importing one runs it)."""
    names = []
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] != "__main__":
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize("package", ["core", "environments"])
def test_importing_every_module_loads_nothing_from_above(package: str) -> None:
    loads_nothing_from_above(package)


def loads_nothing_from_above(package: str) -> None:
    """Import every module of `package` in a clean interpreter; nothing of ours loads that
    `package` may not import (runners: tests/slow/test_layers.py, it loads torch)."""
    script = (
        "import importlib, json, sys\n"
        f"for name in {modules(package)!r}:\n"
        "    importlib.import_module(name)\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = set(json.loads(out.stdout.strip().splitlines()[-1])) & set(OURS)
    assert loaded <= ALLOWED[package], f"{package} loaded {sorted(loaded - ALLOWED[package])}"
