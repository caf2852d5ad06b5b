"""core.child, both ends in real processes: typed messages one JSON line each, a channel that
what the child's code prints or reads cannot touch, the child ending at the end of its input,
a death reported with its log's last lines, and a kill that takes the child's own children."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import pytest
from pydantic import BaseModel, Field, TypeAdapter

from core.child import Child
from core.settings import PROJECT_ROOT
from tests.support.helpers import pid_alive, wait_for


class Echo(BaseModel):
    kind: Literal["echo"] = "echo"
    text: str


class Said(BaseModel):
    kind: Literal["said"] = "said"
    text: str
    pid: int


Line = Annotated[Echo | Said, Field(discriminator="kind")]
LINES: TypeAdapter[Line] = TypeAdapter(Line)

# The child: prints and reads what a careless library would, answers each Echo with a Said.
CHILD = """
import os, subprocess, sys
from typing import Literal
from pydantic import BaseModel, TypeAdapter
from core.child import LineChannel

class Echo(BaseModel):
    kind: Literal["echo"] = "echo"
    text: str

class Said(BaseModel):
    kind: Literal["said"] = "said"
    text: str
    pid: int

channel = LineChannel(prints="log")
print("a stray print")                  # into the log, not the channel
assert sys.stdin.read() == ""           # reads nothing: the channel's input is private
sys.stderr.write("started\\n")
sys.stderr.flush()

def answer(echo: Echo) -> None:
    if echo.text == "die":
        sys.stderr.write("dying on purpose\\n")
        sys.stderr.flush()
        os._exit(3)
    if echo.text == "spawn":
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        channel.send(Said(text="spawned", pid=grandchild.pid))
        return
    print("another stray print")
    channel.send(Said(text=echo.text.upper(), pid=os.getpid()))

channel.serve_lines(TypeAdapter(Echo), answer)
"""


@pytest.fixture
def child(tmp_path: Path) -> Iterator[Child[Line]]:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    started: Child[Line] = Child(
        "the test child",
        [sys.executable, str(script)],
        LINES,
        cwd=PROJECT_ROOT,
        env={"PYTHONPATH": str(PROJECT_ROOT), "PATH": "/usr/bin:/bin"},
        log_path=tmp_path / "child.log",
    )
    yield started
    started.kill()


def test_messages_go_both_ways_typed_whatever_the_child_prints(child: Child[Line]) -> None:
    assert child.send(Echo(text="hello"))
    said = child.receive(timeout=30)
    assert isinstance(said, Said) and (said.text, said.pid) == ("HELLO", child.pid)
    assert child.log_path is not None
    wait_for(lambda: "another stray print" in child.log_path.read_text(), 5)
    assert "a stray print" in child.log_path.read_text()


def test_the_end_of_its_input_ends_the_child(child: Child[Line]) -> None:
    assert child.send(Echo(text="hi")) and child.receive(timeout=30) is not None
    child.stop()
    assert not child.alive and child.exit_status() == "exit code 0"
    assert child.receive(timeout=5) is None  # its output ended too


def test_a_death_is_reported_with_the_tail_of_its_log(child: Child[Line]) -> None:
    assert child.send(Echo(text="die"))
    assert child.receive(timeout=30) is None
    assert child.exit_status() == "exit code 3"
    why = child.failure("it exited while answering")
    assert why.startswith("the test child failed: it exited while answering. Last lines")
    assert "dying on purpose" in why and "started" in why
    assert not child.send(Echo(text="anyone?"))


def test_a_kill_takes_what_the_child_started(child: Child[Line]) -> None:
    assert child.send(Echo(text="spawn"))
    spawned = child.receive(timeout=30)
    assert isinstance(spawned, Said) and pid_alive(spawned.pid)
    child.kill()
    assert not child.alive
    wait_for(lambda: not pid_alive(spawned.pid), 5)


def test_a_line_that_is_not_the_protocols_is_handed_to_its_owner(tmp_path: Path) -> None:
    """Where the owner waits on an answer by id, a lost answer must not leave it waiting."""
    script = tmp_path / "child.py"
    script.write_text(
        'import sys\nprint(\'{"kind": "said", "text": 1}\')\n'
        'print(\'{"kind": "echo", "text": "fine"}\')\nsys.stdout.flush()\n'
    )
    lost: list[str] = []
    started: Child[Line] = Child(
        "the test child",
        [sys.executable, str(script)],
        LINES,
        cwd=PROJECT_ROOT,
        env={"PATH": "/usr/bin:/bin"},
        on_invalid=lost.append,
    )
    try:
        assert isinstance(started.receive(timeout=30), Echo)  # the valid one still comes
        assert lost == [
            "the test child wrote a line that is not its protocol's (said.text: "
            "Input should be a valid string)"
        ]
    finally:
        started.kill()
