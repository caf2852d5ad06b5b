"""Engine hosts started under a folder (by a test, a benchmark), stopped: they outlive whoever
started them by design."""

from __future__ import annotations

from pathlib import Path

from core import engine_host


def stop_engine_hosts(folder: Path) -> None:
    """Every engine host recorded under `folder` (var/engine/<node>/<index>/host.json, or the
    former var/engine/host.json)."""
    records = [*folder.glob(f"**/engine/*/*/{engine_host.RECORD}")]
    var_dirs = {record.parents[3] for record in records}
    var_dirs |= {record.parents[1] for record in folder.glob(f"**/engine/{engine_host.RECORD}")}
    for var_dir in var_dirs:
        engine_host.stop(var_dir)
