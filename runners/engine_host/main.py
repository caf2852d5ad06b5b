"""An engine host process: `python -m runners.engine_host`, one per slot of its machine
(core/engine_slots.py: one per GPU, pinned to it by CUDA_VISIBLE_DEVICES). It takes its slot's
lock (a second host of the slot exits at once), listens on its socket, writes its record, and
serves its clients (host.py) until SIGTERM or until no client has been connected for
RLCS_ENGINE_IDLE_S. Started detached by whoever needs it first (core/engine_host.py): it outlives
the server that started it, and the next server adopts it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
import time

from core import engine_host, procs
from core.engine_slots import Slot, this_slot
from core.engine_wire import WIRE
from core.line_socket import listen
from core.settings import Settings
from runners.backends.factory import local_service
from runners.engine import openmp
from runners.engine_host.host import EngineHost, device_memory
from runners.engine_host.inference import InferenceLoop
from runners.engine_host.warm_up import warm_up

log = logging.getLogger("engine-host")


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = Settings()
    slot = this_slot(settings)
    home = engine_host.folder(settings.var_dir, slot)
    home.mkdir(parents=True, exist_ok=True)
    lock = (home / engine_host.LOCK).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("another engine host holds %s: this one exits", home)
        return 0
    path = engine_host.socket_path(settings.var_dir, slot)
    listener = listen(path)
    share_the_cores(slot)
    budget = slot.budget_bytes(settings, device_memory()[0])
    service = local_service(
        settings, settings.var_dir / "tinker", memory_budget_bytes=budget, device_share=slot.share
    )
    started_at = time.time()
    host = EngineHost(
        listener,
        service,
        InferenceLoop(settings, service),
        slot=slot,
        started_at=started_at,
        budget_bytes=budget,
        client_timeout_s=settings.engine_client_timeout_s,
        idle_s=settings.engine_idle_s,
    )
    signal.signal(signal.SIGTERM, lambda *_: host.stop())
    engine_host.write_record(
        home,
        engine_host.HostRecord(
            pid=os.getpid(),
            started=procs.process_start_time(os.getpid()),
            started_at=started_at,
            wire=WIRE,
            socket=str(path),
        ),
    )
    # Beside its first clients (who may arrive now): its loader takes one load at a time.
    threading.Thread(target=warm_up, args=(service,), daemon=True, name="warm-up").start()
    log.info(
        "host %s on %s listening on %s (pid %s, wire %s, budget %s)",
        slot.name,
        service.device,
        path,
        os.getpid(),
        WIRE,
        "none" if budget is None else f"{budget / (1 << 30):.2f} GiB",
    )
    try:
        host.serve()
    finally:
        (home / engine_host.RECORD).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        log.info("stopped")
    # The clients are gone; what is still decoding or training is nobody's now.
    os._exit(0)


def share_the_cores(slot: Slot) -> None:
    """The machine's one host keeps every core and lets busy threads' OpenMP workers spin;
    hosts beside each other split the cores and let theirs sleep, as private engines do."""
    import torch

    alone = slot.hosts == 1
    openmp.set_sole_engine(alone)
    if not alone:
        torch.set_num_threads(slot.cpu_threads(os.cpu_count() or 1))
