"""Which waiting sample requests join the running batch before its next step: fair turns.

Clients (a Tinker session, a run's trainer, a /v1 caller) take turns, each turn the client
whose oldest waiting request is oldest taking that request. While other clients wait, a
client with rows decoding already stops at its share of the batch (capacity / clients), so a
client that sends back to back cannot hold a newcomer back for longer than its rows take to
finish; alone, a client may fill the batch. Requests keep arrival order across clients: the
oldest that does not fit the room left (or the running rows' cache) stops the turns, and
nothing smaller overtakes it. A request whose adapter finds no slot free waits without
stopping the others; one whose adapter cannot load is refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from runners.engine.sample.batch import Row


class Waiting(Protocol):
    """What admission reads of a request."""

    client: str
    order: int  # arrival: lower is older
    rows: list[Row]


R = TypeVar("R", bound=Waiting)


@dataclass
class Admitted(Generic[R]):
    joining: list[R] = field(default_factory=list)
    refused: list[tuple[R, ValueError]] = field(default_factory=list)


def admit(
    waiting: Sequence[R],
    live: Mapping[str, int],
    *,
    capacity: int,
    running: int,
    fits: Callable[[list[Row]], bool],
    hold: Callable[[R], bool],
) -> Admitted[R]:
    """`waiting`: the backlog in arrival order; `live`: rows each client decodes now;
    `capacity`: rows a batch holds; `running`: rows it holds now; `fits(rows)`: whether they
    fit beside the running ones (their cache); `hold(request)`: give the request its adapter's
    slot (False: every slot is held; a ValueError: its adapter cannot load)."""
    queues: dict[str, deque[R]] = {}
    for request in waiting:
        queues.setdefault(request.client, deque()).append(request)
    clients = set(queues) | {client for client, rows in live.items() if rows > 0}
    share = max(1, capacity // max(1, len(clients)))
    rows_of = {client: live.get(client, 0) for client in clients}
    room = capacity - running
    admitted: Admitted[R] = Admitted()
    skipped: set[str] = set()  # capped, or no slot for its adapter: its later turns pass too
    while True:
        turns = sorted(
            (c for c, q in queues.items() if q and c not in skipped),
            key=lambda c: queues[c][0].order,
        )
        progress = False
        for client in turns:
            request = queues[client][0]
            rows = len(request.rows)
            others = any(q for c, q in queues.items() if c != client)
            if others and rows_of[client] and rows_of[client] + rows > share:
                skipped.add(client)
                continue
            if rows > room and (admitted.joining or room < capacity):
                return admitted  # it waits for room; nothing overtakes it
            if running and rows and not fits(request.rows):
                return admitted  # it waits for the running rows to drain (a longer cache)
            try:
                slotted = hold(request)
            except ValueError as error:
                queues[client].popleft()
                admitted.refused.append((request, error))
                progress = True
                continue
            if not slotted:
                skipped.add(client)
                continue
            queues[client].popleft()
            admitted.joining.append(request)
            room -= rows
            rows_of[client] += rows
            progress = True
        if not progress:
            return admitted
