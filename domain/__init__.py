"""The model: the aggregates (one module each: job, job_name, node, datasets), their lifecycle
table, statuses, errors and the values' bounds, the scheduling policy, and the application
service that is the only write path to the ledger.
Imports: nothing of ours (the standard library and eventsourcing only)."""
