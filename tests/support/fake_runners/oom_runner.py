"""A stand-in runner that the kernel's OOM killer ends: it moves itself into the memory cgroup
FAKE_OOM_CGROUP (made by the test, with a small limit), records `running`, then allocates until
it is killed. Should the limit not hold, it writes `survived` in its run folder and exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from core import lifecycle
from core.db import make_engine
from core.procs import process_start_time
from core.run_folder import RunFolder
from core.settings import Settings

CHUNK = 16 << 20
CAP = 512 << 20  # far above the test's limit, low enough to harm nothing if it does not hold


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    folder = RunFolder(parser.parse_args().run_dir)
    engine = make_engine(Settings().db_url)
    pid = os.getpid()
    (Path(os.environ["FAKE_OOM_CGROUP"]) / "cgroup.procs").write_text(str(pid))
    lifecycle.record_running(engine, folder.spec().run_id, pid, process_start_time(pid))
    print(f"oom fake up (pid {pid}), allocating", flush=True)
    held = []
    while len(held) * CHUNK < CAP:
        held.append(bytearray(CHUNK))  # zero-filled: every page is touched
    (folder.path / "survived").write_text(str(len(held) * CHUNK))
    return 0


if __name__ == "__main__":
    sys.exit(main())
