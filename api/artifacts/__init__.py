"""What jobs produce and read, as bytes: the artifact store (logs, checkpoints, outputs) on local
files or in an S3 bucket, dataset archives, `logs --follow` streams, and agents' uploads
completed and recorded in the ledger (``recording``).
Imports: common (attempts' keys), domain, ledger (the operational database: the S3 store's log
tables, uploads), projections (the views a recorded artifact is waited for in)."""
