"""Entry point: `python -m runners.tinker_engine` (started by the server on first use)."""

from runners.tinker_engine.main import main

raise SystemExit(main())
