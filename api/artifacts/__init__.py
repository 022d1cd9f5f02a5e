"""What jobs produce and read, as bytes: the artifact store (logs, checkpoints, outputs) on local
files or in an S3 bucket, dataset archives, and `logs --follow` streams.
Imports: common (attempts' keys), domain, ledger (the operational database: the S3 store's log
tables, uploads)."""
