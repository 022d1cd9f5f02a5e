"""The model: the aggregates and their lifecycle rules, the values' bounds, the scheduling
policy, and the application service that is the only write path to the ledger.
Imports: nothing of ours (the standard library and eventsourcing only)."""
