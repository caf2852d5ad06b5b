"""Fair turns at the decode batch's door (admission.py): clients take turns oldest first, a
client with rows decoding stops at its share while others wait and not when alone, the oldest
request that does not fit stops the turns, an adapter with no free slot waits without holding
the others back, one that cannot load is refused."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import count

from runners.engine.sample.admission import admit
from runners.engine.sample.batch import Row

_order = count(1)


@dataclass
class Request:
    client: str
    size: int
    order: int = field(default_factory=lambda: next(_order))
    rows: list[Row] = field(init=False)

    def __post_init__(self) -> None:
        row = dict(max_tokens=4, temperature=1.0, top_k=0, top_p=1.0, seed=0)
        self.rows = [
            Row(prompt=[1], stop_ids=frozenset(), stop_strings=(), **row) for _ in range(self.size)
        ]


def _admit(waiting, live=None, capacity=64, running=0, fits=lambda rows: True, hold=None):
    return admit(
        waiting,
        live or {},
        capacity=capacity,
        running=running,
        fits=fits,
        hold=hold or (lambda request: True),
    )


def test_clients_take_turns_oldest_first():
    x1, x2, x3, y1, z1 = (Request(c, 4) for c in "xxxyz")
    got = _admit([x1, x2, x3, y1, z1]).joining
    assert got == [x1, y1, z1, x2, x3]


def test_a_client_with_rows_stops_at_its_share_while_others_wait():
    x, y = Request("x", 8), Request("y", 8)
    # x already decodes 28 rows of 64; two clients: a share of 32.
    assert _admit([x, y], live={"x": 28}).joining == [y]
    # Alone, x may fill the batch.
    assert _admit([x], live={"x": 28}).joining == [x]


def test_a_newcomer_gets_the_room_a_back_to_back_client_frees():
    """x sent requests back to back and holds the batch; y arrived later. When rows of x
    finish, y's request takes the room before x's next one, though x's is older."""
    x_next = Request("x", 16)
    y = Request("y", 16)
    got = _admit([x_next, y], live={"x": 48}, running=48).joining
    assert got == [y]


def test_the_oldest_request_that_does_not_fit_stops_the_turns():
    big, small = Request("x", 40), Request("y", 2)
    assert _admit([big, small], running=32).joining == []
    # Into an empty batch a request larger than it still goes (the batch grows).
    huge, after = Request("x", 100), Request("y", 2)
    assert _admit([huge, after]).joining == [huge]
    # The running rows' cache cannot take it: it waits, and so does what came after.
    assert _admit([small, Request("z", 1)], running=4, fits=lambda rows: False).joining == []


def test_an_adapter_without_a_free_slot_waits_and_one_that_cannot_load_is_refused():
    waiting_for_slot, ok, broken = Request("x", 2), Request("y", 2), Request("z", 2)

    def hold(request: Request) -> bool:
        if request is broken:
            raise ValueError("the adapter was trained on another base model")
        return request is not waiting_for_slot

    admitted = _admit([waiting_for_slot, ok, broken], hold=hold)
    assert admitted.joining == [ok]
    assert [(r, str(e)) for r, e in admitted.refused] == [
        (broken, "the adapter was trained on another base model")
    ]
