"""The fault-injection scenarios of benchmarks/faults.py, kept small, with their invariants:
nothing lost, nothing stuck, nothing run twice, no 5xx but a documented 503."""

from __future__ import annotations

from benchmarks.faults import kill_during_starts, locked_database


def test_server_kill_9_with_starts_in_flight_loses_nothing() -> None:
    outcome = kill_during_starts(rounds=2, seed=1)
    assert outcome.injected == 2 and outcome.runs_affected > 0, outcome
    assert (outcome.lost, outcome.stuck, outcome.duplicates) == (0, 0, 0), outcome


def test_a_locked_database_is_waited_for_or_a_503() -> None:
    outcome = locked_database(seconds=5.0)
    assert outcome.server_errors == 0 and outcome.lost == 0 and outcome.stuck == 0, outcome
