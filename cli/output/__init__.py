"""Everything the CLI prints for people, and all of it: one module per kind of view (tables,
the YAML-like inspect view, jobs, datasets, the ledger) on the value formats they share.

Only the standard library at the top of each module, so that importing one costs nothing.
Imports: common (inside a function)."""
