"""The log follow's first read: the tail and where to continue come from one read, so no line
is shown twice and a half-written line is shown once, whole. What a line is: up to an LF."""

from __future__ import annotations

from pathlib import Path

from core.run_folder import log_lines
from server.runs.logs import _line, _read_from, _tail_and_offset


def test_tail_and_offset_come_from_one_read(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"one\ntwo\nthree\npart")
    lines, offset = _tail_and_offset(log, 2)
    assert lines == ["two", "three"]
    # Written after the tail was read: it follows, and nothing already shown comes again.
    with log.open("ab") as fh:
        fh.write(b"ial line\nfour\n")
    data, end = _read_from(log, offset)
    assert data == b"partial line\nfour\n"
    assert end == log.stat().st_size


def test_empty_or_missing_log(tmp_path: Path) -> None:
    assert _tail_and_offset(tmp_path / "missing.log", 5) == ([], 0)
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert _tail_and_offset(empty, 5) == ([], 0)
    assert _tail_and_offset(empty, 0) == ([], 0)


def test_a_line_ends_at_lf_or_crlf_and_keeps_a_bare_cr() -> None:
    text = "10%\r50%\r100%\nwindows\r\n\nlast"
    assert log_lines(text) == ["10%\r50%\r100%", "windows", "", "last"]
    assert log_lines(text + "\n") == log_lines(text)
    assert log_lines("") == []
    # The follow cuts its bytes the same way, and its tail agrees with the JSON tail.
    assert [_line(raw) for raw in text.encode().split(b"\n")] == log_lines(text)


def test_the_tail_keeps_carriage_returns(tmp_path: Path) -> None:
    log = tmp_path / "train.log"
    log.write_bytes(b"a\rb\r\nc\n")
    assert _tail_and_offset(log, 5) == (["a\rb", "c"], 7)
