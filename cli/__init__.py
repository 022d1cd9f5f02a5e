"""The `flexai` command-line client: one module per subcommand, one HTTP client class
(``cli.client``), one output package (``cli.output``). `flexai server` and `flexai agent` are
handed to ``api.server`` and ``node_agent.main`` by module name when they run, the only link
to them.
Imports: common."""

import sys

# httpx imports its own command line (click, rich and pygments, about 40 ms of every flexai
# command) wherever those are installed, as they are in many ML environments; flexai never runs
# it. A module that sys.modules maps to None is refused on import, and httpx then goes without.
sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
