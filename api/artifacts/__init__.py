"""What jobs produce and read, as bytes: the artifact store (logs, checkpoints, outputs),
dataset archives, and `logs --follow` streams.
Imports: domain."""
