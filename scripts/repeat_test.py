"""Run one test N times in a row, each in a fresh pytest process, and count the passes: for a
test whose outcome a run's randomness can sway (issue 53: the learning test, 20 in a row).

    .venv/bin/python scripts/repeat_test.py \\
        tests/training/test_training.py::test_learning_is_real_on_repeat_word --times 20
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time


def run_once(test: str) -> tuple[bool, float, str]:
    """One pytest process: passed, its seconds, and its last line (the failure's reason)."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    why = [line.strip() for line in lines if line.startswith("E ")][:3]  # a failure's reason
    last = " | ".join([*why, lines[-1]]) if lines else done.stderr
    return done.returncode == 0, time.monotonic() - started, last


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("test", help="a pytest node id")
    parser.add_argument("--times", type=int, default=20)
    args = parser.parse_args()
    passed = 0
    for attempt in range(1, args.times + 1):
        ok, seconds, last = run_once(args.test)
        passed += ok
        print(f"{attempt:3d}: {'pass' if ok else 'FAIL'} in {seconds:.0f} s ({last})", flush=True)
    print(f"{passed}/{args.times} passed")
    return 0 if passed == args.times else 1


if __name__ == "__main__":
    raise SystemExit(main())
