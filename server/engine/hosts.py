"""This machine's engine hosts as the server sees them: a link to each (one per slot, made on
first need), and placement: the host a base model goes to (core/engine_placement.py: one that
holds it, else an empty one, else the one with the most room), its base claimed there before the
next placement looks. A Tinker session is placed once, at its first model; /v1 and test
inference requests each time (a base already held is found at once)."""

from __future__ import annotations

from core.engine_host import HostUnavailable
from core.engine_placement import placing
from core.engine_slots import Slot, plan
from core.settings import Settings
from server.engine.link import EngineLink, Listener
from server.errors import Unavailable


class EngineHosts:
    def __init__(self, settings: Settings) -> None:
        """SlotsRefused (from plan) for RLCS_ENGINE_HOSTS this machine cannot give."""
        self._settings = settings
        self.slots: list[Slot] = plan(settings)
        self.links = [EngineLink(settings, slot) for slot in self.slots]

    def listen(self, listener: Listener) -> None:
        for link in self.links:
            link.listen(listener)

    def place(self, base: str | None) -> EngineLink:
        """The link to the host `base` goes to, connected (it may start the host: seconds;
        keep it off an event loop). Unavailable when that host cannot be reached."""
        with placing(self._settings, base) as placed:
            link = self.links[placed.slot.index]
            client = link.client()
            if placed.claim and base is not None:
                try:
                    client.claim(base)
                except HostUnavailable as exc:
                    raise Unavailable(str(exc)) from None
        return link

    def close(self) -> None:
        """The server stops: it leaves every host (they go on for their runs)."""
        for link in self.links:
            link.close()
