"""The engine host process: `python -m runners.engine_host`, one per var/ folder. It takes the
folder's lock (a second host exits at once), listens on its socket, writes its record, and
serves its clients (host.py) until SIGTERM or until no client has been connected for
RLCS_ENGINE_IDLE_S. Started detached by whoever needs it first (core/engine_host.py): it
outlives the server that started it, and the next server adopts it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import time

from core import engine_host, procs
from core.engine_wire import WIRE
from core.line_socket import listen
from core.settings import Settings
from runners.backends.factory import local_service
from runners.engine import openmp
from runners.engine_host.host import EngineHost
from runners.engine_host.inference import InferenceLoop

GIB = 1 << 30
log = logging.getLogger("engine-host")


def main() -> int:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    settings = Settings()
    folder = engine_host.folder(settings.var_dir)
    folder.mkdir(parents=True, exist_ok=True)
    lock = (folder / engine_host.LOCK).open("a")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        log.info("another engine host holds %s: this one exits", folder)
        return 0
    path = engine_host.socket_path(settings.var_dir)
    listener = listen(path)
    budget = int(settings.engine_memory_budget_gb * GIB)
    openmp.set_sole_engine(True)  # the machine's one engine: busy threads' workers spin
    service = local_service(settings, settings.var_dir / "tinker", memory_budget_bytes=budget)
    started_at = time.time()
    host = EngineHost(
        listener,
        service,
        InferenceLoop(settings, service),
        started_at=started_at,
        budget_bytes=budget,
        client_timeout_s=settings.engine_client_timeout_s,
        idle_s=settings.engine_idle_s,
    )
    signal.signal(signal.SIGTERM, lambda *_: host.stop())
    engine_host.write_record(
        settings.var_dir,
        engine_host.HostRecord(
            pid=os.getpid(),
            started=procs.process_start_time(os.getpid()),
            started_at=started_at,
            wire=WIRE,
            socket=str(path),
        ),
    )
    log.info("listening on %s (pid %s, wire %s)", path, os.getpid(), WIRE)
    try:
        host.serve()
    finally:
        (folder / engine_host.RECORD).unlink(missing_ok=True)
        path.unlink(missing_ok=True)
        log.info("stopped")
    # The clients are gone; what is still decoding or training is nobody's now.
    os._exit(0)
