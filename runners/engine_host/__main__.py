"""Entry point: `python -m runners.engine_host` (started by whoever needs the host first)."""

from runners.engine_host.main import main

raise SystemExit(main())
