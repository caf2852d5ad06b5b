"""A stand-in runner that writes real checkpoints (the local backend's publish, manifest, index
and database records) and resumes from them as the real runner does, quick enough for crash
tests that need many runs. One state checkpoint after every step but the last.

FAKE_PAUSE_AT = {"<seed>": "<point>"} (JSON, keyed by the run's config seed so that many runs
can go at once), point resume | sampling:<step> | training:<step> | checkpoint:<step>:<chunks>:
there it writes `paused` in its run folder and waits until the test removes it (or kills it).
A resume pauses before it picks its checkpoint; a checkpoint after writing <chunks> of its
FAKE_CHUNKS (default 4) chunks of FAKE_CHUNK_BYTES (default 256 KiB), where <chunks> =
FAKE_CHUNKS means the files are written but not sealed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from core import durable, lifecycle
from core.db import make_engine
from core.models import RunStatus
from core.procs import process_start_time
from core.run_folder import RunFolder
from core.settings import Settings
from runners.engine.checkpoints import (
    STATE_FORMAT,
    STATE_KIND,
    STATE_RECORD,
    checkpoint_folder,
    find_state,
    publish,
    write_record,
)
from runners.train.resume import loadable_state

PAYLOAD = "payload.bin"
PAUSED = "paused"


class Fake:
    def __init__(self, run_dir: Path) -> None:
        self.folder = RunFolder(run_dir)
        self.spec = self.folder.spec()
        self.engine = make_engine(Settings().db_url)
        plan = json.loads(os.environ.get("FAKE_PAUSE_AT", "{}"))
        self.pause_at = plan.get(str(self.spec.config.get("seed")), "")
        self.chunks = int(os.environ.get("FAKE_CHUNKS", "4"))
        self.chunk_bytes = int(os.environ.get("FAKE_CHUNK_BYTES", str(256 << 10)))

    def run(self) -> int:
        run_id = self.spec.run_id
        pid = os.getpid()
        lifecycle.record_running(self.engine, run_id, pid, process_start_time(pid))
        print(f"checkpointing fake {run_id} up (pid {pid})", flush=True)
        start = self.resume()
        total = int(self.spec.config["total_steps"])
        for step in range(start + 1, total + 1):
            self.pause_if(f"sampling:{step}")
            self.pause_if(f"training:{step}")
            lifecycle.record_step(self.engine, run_id, step, {"reward/mean": step / 10})
            print(f"step {step}/{total}", flush=True)
            if step < total:
                self.save(step)
        lifecycle.record_end(self.engine, run_id, RunStatus.succeeded)
        print("done", flush=True)
        return 0

    def resume(self) -> int:
        point = self.folder.resume_point()
        if point is None:
            return 0
        self.pause_if("resume")
        path, step = loadable_state(point.state_path, point.step)
        folder, record = find_state(path)  # checks the manifest, as the real backend does
        payload = (folder / PAYLOAD).read_bytes()
        if record["step"] != step or payload != self.payload(step):
            raise RuntimeError(f"{folder} does not hold step {step}")
        if step != point.step:
            lifecycle.rewind(self.engine, self.spec.run_id, step)
        print(f"resumed from {path} at step {step}", flush=True)
        return step

    def save(self, step: int) -> None:
        name = f"step-{step:06d}"
        target = checkpoint_folder(self.folder.path / "checkpoints", name, STATE_KIND)

        def build(tmp: Path) -> None:
            with (tmp / PAYLOAD).open("wb") as fh:
                for chunk in range(self.chunks):
                    self.pause_if(f"checkpoint:{step}:{chunk}")
                    fh.write(bytes([step % 256]) * self.chunk_bytes)
                    fh.flush()
            self.pause_if(f"checkpoint:{step}:{self.chunks}")
            write_record(tmp, STATE_RECORD, {"format": STATE_FORMAT, "step": step})

        publish(target, build)
        lifecycle.record_checkpoint(self.engine, self.spec.run_id, step, "state", name, str(target))
        record = {"name": name, "step": step, "state_path": str(target), "final": False}
        self.folder.append_checkpoint(record)
        print(f"checkpoint {name}", flush=True)

    def payload(self, step: int) -> bytes:
        return bytes([step % 256]) * (self.chunks * self.chunk_bytes)

    def pause_if(self, point: str) -> None:
        if point != self.pause_at:
            return
        marker = self.folder.path / PAUSED
        durable.write_bytes_atomic(marker, point.encode())
        print(f"paused at {point}", flush=True)
        deadline = time.monotonic() + 60  # never outlive a test that forgot us
        while marker.exists():
            if time.monotonic() > deadline:
                sys.exit(2)
            time.sleep(0.02)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir", type=Path, required=True)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(message)s")
    return Fake(parser.parse_args().run_dir).run()


if __name__ == "__main__":
    sys.exit(main())
