"""`python -m runners.inspector`."""

import sys

from runners.inspector.inspect_config import main

sys.exit(main(sys.argv[1:]))
