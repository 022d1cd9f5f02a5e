"""The ledger's own care: how events are stored (encryption, compression) and `admin verify`,
which recomputes the hash chain and compares every job folded from the ledger with the views.
Imports: api.services, domain, projections."""
