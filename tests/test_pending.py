"""The pending-call table every line-protocol wire's sender keeps (core/pending.py)."""

from __future__ import annotations

from core.pending import PendingCalls


def test_an_answer_finds_its_call_once_and_an_ended_table_takes_none() -> None:
    calls: PendingCalls[str] = PendingCalls()
    first, second = calls.add("a"), calls.add("b")
    assert first is not None and second is not None and first != second
    assert calls.get(first) == "a" and calls.get(None) is None
    assert calls.pop(first) == "a" and calls.pop(first) is None  # a late second answer: nothing
    assert calls.waiting() == ["b"]
    assert calls.end("the host is gone") == ["b"]
    assert calls.ended == "the host is gone" and calls.waiting() == []
    assert calls.add("c") is None  # sent now, it would wait for ever
