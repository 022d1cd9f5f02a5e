"""``python -m node_agent ...``: the same as ``flexai agent ...``."""

import sys

from node_agent.main import main

sys.exit(main())
