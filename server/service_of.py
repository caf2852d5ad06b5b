"""How a route asks for its domain's service: `Annotated[RunService, Depends(run_service)]`
with `run_service = service_of("runs", RunService)`, read off the app's container
(`app.state.services`, set by the lifespan) without importing it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fastapi import Request

S = TypeVar("S")


def service_of(name: str, kind: type[S]) -> Callable[[Request], S]:
    """A dependency giving the container's service `name`, which is a `kind` (checked: the
    name is matched by string, where the type checker cannot follow it)."""

    def dependency(request: Request) -> S:
        service = getattr(request.app.state.services, name)
        if not isinstance(service, kind):
            raise TypeError(f"services.{name} is a {type(service).__name__}, not {kind.__name__}")
        return service

    dependency.__name__ = f"{name}_service"
    return dependency
