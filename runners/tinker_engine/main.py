"""The engine process: requests as JSON lines on stdin, acknowledgements and answers as JSON
lines on stdout. It exits the moment stdin closes (the server is gone, however it died),
busy or not: nobody is left to want its answers.

The protocol owns the real stdout; anything else that prints (a library's warning) lands in
the log through file descriptor 1, which points at stderr.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
from typing import IO, Any

from core.settings import Settings
from runners.engine.local import LocalServiceClient
from runners.tinker_engine.engine import TinkerEngine

GIB = 1 << 30


class LineWriter:
    """One JSON message per line, from any thread."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def send(self, message: dict[str, Any]) -> None:
        line = json.dumps(message, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                self._stream.write(line)
                self._stream.flush()
            except (BrokenPipeError, OSError, ValueError):
                os._exit(0)  # the server is gone


def main() -> int:
    protocol = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = Settings()
    service = LocalServiceClient(
        checkpoint_dir=settings.var_dir / "tinker",
        models_dir=settings.models_dir,
        device=settings.device,
        dtype=settings.dtype,
        sampling_dtype=settings.sampling_dtype,
        tokens_per_microbatch=settings.tokens_per_microbatch,
        memory_budget_bytes=int(settings.tinker_memory_budget_gb * GIB),
    )
    writer = LineWriter(protocol)
    engine = TinkerEngine(service, writer.send)
    logging.getLogger("tinker-engine").info("ready (pid %s)", os.getpid())
    writer.send({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        if line.strip():
            engine.handle(json.loads(line))
    # End of input: the server closed our stdin or died. Queued work dies with us.
    os._exit(0)
