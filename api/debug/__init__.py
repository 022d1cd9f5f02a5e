"""Debug sessions (`flexai training debug-ssh`): the relay between the CLI and the agent, each
server's presence, and the sweep that closes sessions a dead server left open.
Imports: api.scheduling, domain, ledger, projections."""
