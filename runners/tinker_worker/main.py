"""The Tinker worker process: requests in, acknowledgements and answers out, one JSON line each
(core.tinker_wire over core.child's LineChannel). It exits the moment its input closes (the
server is gone, however it died), busy or not: nobody is left to want its answers. What a
library prints goes to its log, never into the protocol.
"""

from __future__ import annotations

import logging
import os
import sys

from core.child import LineChannel
from core.settings import Settings
from core.tinker_wire import REQUEST, Ready
from runners.engine.local import LocalServiceClient
from runners.tinker_worker.worker import TinkerWorker

GIB = 1 << 30


def main() -> int:
    channel = LineChannel(prints="log")
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
        adapter_slots=settings.adapter_slots,
        max_lora_rank=settings.max_lora_rank,
        tokens_per_microbatch=settings.tokens_per_microbatch,
        memory_budget_bytes=int(settings.tinker_memory_budget_gb * GIB),
    )
    worker = TinkerWorker(service, channel.send)
    logging.getLogger("tinker-worker").info("ready (pid %s)", os.getpid())
    channel.send(Ready(pid=os.getpid()))
    # Queued work dies with the process when the input ends.
    channel.serve_lines(REQUEST, worker.handle, worker.refuse_line)
