"""Entry point: `python -m runners.tinker_worker` (started by the server on first use)."""

from runners.tinker_worker.main import main

raise SystemExit(main())
