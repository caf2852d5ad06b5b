"""A process that writes two checkpoints with the local backend's publish and stops inside the
second, for tests that SIGKILL it there: `python -m tests.support.fake_runners.publisher DIR POINT`.

POINT: mid-file (half of the weights written), unsealed (every file written, no manifest yet)
or sealed (manifest written, not yet renamed into place). It writes DIR/paused once there.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from runners.engine import checkpoints
from runners.engine.checkpoints import (
    STATE_FORMAT,
    STATE_KIND,
    STATE_RECORD,
    checkpoint_folder,
    publish,
    write_record,
)

CHUNK = 4 << 20  # two chunks: a checkpoint of 8 MiB
WEIGHTS = "weights.bin"


def weights(step: int) -> bytes:
    return bytes([step]) * CHUNK


def build(step: int, pause_at: str | None, pause: Callable[[], None]) -> Callable[[Path], None]:
    def write(tmp: Path) -> None:
        with (tmp / WEIGHTS).open("wb") as fh:
            fh.write(weights(step))
            fh.flush()
            if pause_at == "mid-file":
                pause()
            fh.write(weights(step))
        write_record(tmp, STATE_RECORD, {"format": STATE_FORMAT, "step": step})
        if pause_at == "unsealed":
            pause()

    return write


def main() -> int:
    checkpoint_dir, point = Path(sys.argv[1]), sys.argv[2]

    def pause() -> None:
        (checkpoint_dir / "paused").write_text(point)
        time.sleep(120)  # the test kills us long before
        sys.exit(2)

    def target(step: int) -> Path:
        return checkpoint_folder(checkpoint_dir, f"step-{step:06d}", STATE_KIND)

    publish(target(1), build(1, None, pause))
    if point == "sealed":
        seal = checkpoints.seal

        def seal_then_pause(folder: Path) -> object:
            manifest = seal(folder)
            pause()
            return manifest

        checkpoints.seal = seal_then_pause  # type: ignore[assignment]
    publish(target(2), build(2, point, pause))
    return 0


if __name__ == "__main__":
    sys.exit(main())
