"""The `flexai` command-line client: one module per subcommand, one HTTP client class
(``cli.client``), one output package (``cli.output``). `flexai server` and `flexai agent` are
handed to ``api.server`` and ``node_agent.main`` by module name when they run, the only link
to them.
Imports: common."""
