"""The model: the aggregates (one module each: job, job_name, node, datasets), their lifecycle
table, statuses, errors and the values' bounds (a job's spec: ``specs``), the scheduling
policy, and the application service that is the only write path to the ledger.
Imports: common.contract and common.job_spec only (the wire contract and a job's spec, of the
standard library alone: its statuses, names' rules, limits and spec are the model's own),
besides the standard library and eventsourcing."""
