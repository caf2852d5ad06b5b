"""`python -m server`: serve the API with uvicorn on the configured host and port."""

from __future__ import annotations

import uvicorn

from core.settings import Settings

SHUTDOWN_WAIT_S = 3


def main() -> None:
    settings = Settings()
    settings.check_bind()
    # On SIGTERM uvicorn waits for requests in flight before shutting down; inference may be
    # one of them, so the wait is bounded (runs are separate processes and carry on).
    uvicorn.run(
        "server.app:app",
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=SHUTDOWN_WAIT_S,
    )


if __name__ == "__main__":
    main()
