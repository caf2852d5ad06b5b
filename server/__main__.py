"""`python -m server`: serve the API with uvicorn on the configured host and port."""

from __future__ import annotations

import uvicorn
from pydantic import ValidationError
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from core.db import make_engine
from core.engine_slots import SlotsRefused, plan
from core.settings import Settings
from server.runs.pricing import PriceTableError, Pricing

SHUTDOWN_WAIT_S = 3


def main() -> None:
    try:
        settings = Settings()
    except ValidationError as exc:
        raise SystemExit(f"rlcs: {_first_error(exc)}") from None
    settings.check_bind()
    check_database(settings)
    check_prices(settings)
    check_engine_hosts(settings)
    # On SIGTERM uvicorn waits for requests in flight before shutting down; inference may be
    # one of them, so the wait is bounded (runs are separate processes and carry on).
    uvicorn.run(
        "server.app:app",
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=SHUTDOWN_WAIT_S,
    )


def check_database(settings: Settings) -> None:
    """One clear line, not a traceback, when the database cannot be used."""
    shown = make_url(settings.db_url).render_as_string(hide_password=True)
    try:
        with make_engine(settings.db_url).connect() as conn:
            conn.execute(text("SELECT 1"))
    except (SQLAlchemyError, ModuleNotFoundError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise SystemExit(
            f"rlcs: RLCS_DATABASE_URL: cannot use {shown}: {reason} (the postgres extra "
            "installs the driver: pip install -e '.[postgres]')"
            if isinstance(exc, ModuleNotFoundError)
            else f"rlcs: RLCS_DATABASE_URL: cannot use {shown}: {reason}"
        ) from None


def check_engine_hosts(settings: Settings) -> None:
    """One line, not a traceback, when RLCS_ENGINE_HOSTS asks for hosts this machine lacks."""
    try:
        plan(settings)
    except SlotsRefused as exc:
        raise SystemExit(f"rlcs: {exc}") from None


def check_prices(settings: Settings) -> None:
    """One line, not a traceback, when hosted Tinker's price table cannot be used."""
    try:
        Pricing.from_settings(settings)
    except PriceTableError as exc:
        raise SystemExit(f"rlcs: {exc}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors(include_url=False)[0]
    return str(err["msg"]).removeprefix("Value error, ")


if __name__ == "__main__":
    main()
