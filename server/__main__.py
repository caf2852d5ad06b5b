"""`python -m server`: serve the API with uvicorn on the configured host and port."""

from __future__ import annotations

import uvicorn

from core.settings import Settings


def main() -> None:
    settings = Settings()
    settings.check_bind()
    uvicorn.run("server.app:app", host=settings.host, port=settings.port, log_level="info")


if __name__ == "__main__":
    main()
