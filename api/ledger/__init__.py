"""The ledger's own care: how events are stored (encryption, compression); `admin verify`,
which recomputes the hash chain, compares every job folded from the ledger with the views and
looks for every artifact the ledger names in the store; `admin purge`, which removes deleted
jobs' artifacts and records it.
Imports: api.artifacts, domain, ledger, projections."""
