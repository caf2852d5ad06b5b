"""Which engine host of this machine a client's base model goes to: one that holds or claims it
already (the fewest users first), else an empty one (a running one before starting another),
else the one with the most room left under its budget. A client places itself once, when it
connects, and stays on that host for its life.

Placing takes the machine's place lock (`var/engine/<node>/place.lock`): a client looks at every
host, chooses, and claims its base on the host it chose (core.engine_wire.Claim) before the next
one looks, so runs starting together on two bases land on two hosts and a base loads once.
"""

from __future__ import annotations

import fcntl
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core import engine_host
from core.engine_slots import Slot, plan
from core.engine_wire import FROM_HOST, Ask, FromHost, Status
from core.line_socket import LineSocket
from core.settings import Settings

PLACE_LOCK = "place.lock"
PROBE_TIMEOUT_S = 10.0
GIB = float(1 << 30)


@dataclass(frozen=True)
class HostView:
    """A host as placement sees it: its slot and, when it runs, its state."""

    slot: Slot
    status: Status | None  # None: not running (all its budget free)

    def room(self) -> float:
        """Bytes left under its budget (infinite when it has none, or does not run yet)."""
        if self.status is None or self.status.budget_bytes is None:
            return math.inf
        return float(self.status.budget_bytes - self.status.held_bytes())

    def users_of(self, base: str) -> int:
        held = self.status.bases if self.status is not None else []
        return sum(b.users for b in held if b.name == base)

    def empty(self) -> bool:
        return self.status is None or not self.status.bases

    def describe(self) -> str:
        """In words, for a run told why it waits: its bases and budget."""
        if self.status is None:
            return f"{self.slot.name} ({self.slot.device}): not running"
        held = ", ".join(
            f"{b.name} ({b.bytes / GIB:.2f} GiB, {b.users} user(s)"
            f"{'' if b.loaded else ', loading'})"
            for b in self.status.bases
        )
        budget = self.status.budget_bytes
        of = f" of {budget / GIB:.2f} GiB" if budget is not None else ""
        return (
            f"{self.slot.name} ({self.status.device}): {self.status.held_bytes() / GIB:.2f} GiB"
            f"{of} held: {held or 'nothing'}"
        )


def choose(views: list[HostView], base: str) -> Slot:
    """The host `base` goes to (see the module's docstring)."""
    holders = [v for v in views if v.status is not None and v.status.holds(base)]
    if holders:
        return min(holders, key=lambda v: (v.users_of(base), v.slot.index)).slot
    empty = [v for v in views if v.empty()]
    if empty:
        return min(empty, key=lambda v: (v.status is None, v.slot.index)).slot
    return max(views, key=lambda v: (v.room(), -v.slot.index)).slot


def probe(var_dir: Path, slot: Slot) -> Status | None:
    """The state of the host of `slot`, asked on a connection of its own (a probe: no client
    is made); None when it does not run or does not answer."""
    record = engine_host.running(var_dir, slot)
    if record is None:
        return None
    try:
        channel: LineSocket[FromHost] = LineSocket.connect(
            Path(record.socket), FROM_HOST, slot.name
        )
    except OSError:
        return None
    try:
        channel.send(Ask(id=0))
        answer = channel.read_one(PROBE_TIMEOUT_S)
    except (OSError, ValueError):
        return None
    finally:
        channel.close()
    return answer if isinstance(answer, Status) else None


def views(settings: Settings) -> list[HostView]:
    """Every host of this machine as it is now."""
    return [HostView(slot, probe(settings.var_dir, slot)) for slot in plan(settings)]


@dataclass(frozen=True)
class Placement:
    slot: Slot
    claim: bool  # whether the client must claim its base there (it is not held there yet)


@contextmanager
def placing(settings: Settings, base: str | None) -> Iterator[Placement]:
    """The host a client on `base` connects to, chosen under the machine's place lock, held
    until the block ends: connect (and claim, where it says so) inside it. With one host, or
    no base to place, the machine's first host."""
    with placing_several(settings, base, 1) as placed:
        yield placed[0]


@contextmanager
def placing_several(settings: Settings, base: str | None, count: int) -> Iterator[list[Placement]]:
    """`count` different hosts for one client on `base` (a run sampling or training on several,
    issue 55), each chosen as `placing` chooses one among those not chosen yet, under the place
    lock held until the block ends. ValueError when the machine has fewer hosts."""
    slots = plan(settings)
    if count > len(slots):
        raise ValueError(
            f"{count} engine hosts asked for; this machine has {len(slots)} (RLCS_ENGINE_HOSTS)"
        )
    if len(slots) == 1 or base is None:
        yield [Placement(slot, claim=False) for slot in slots[:count]]
        return
    home = engine_host.node_folder(settings.var_dir, settings.node_name)
    home.mkdir(parents=True, exist_ok=True)
    with (home / PLACE_LOCK).open("a") as turn:
        fcntl.flock(turn, fcntl.LOCK_EX)
        yield choose_several([HostView(s, probe(settings.var_dir, s)) for s in slots], base, count)


def choose_several(views: list[HostView], base: str, count: int) -> list[Placement]:
    """`count` different hosts for `base`, each as `choose` picks among those left."""
    left, placed = list(views), []
    for _ in range(count):
        slot = choose(left, base)
        view = next(v for v in left if v.slot == slot)
        left.remove(view)
        placed.append(Placement(slot, claim=view.status is None or not view.status.holds(base)))
    return placed
