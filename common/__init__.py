"""What the CLI, the server and the agent all use: durations and the client config file.
Imports: nothing of ours (the standard library only)."""
