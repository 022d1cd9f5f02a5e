"""The views: database connections (SQLite, PostgreSQL), the tables each event changes, the
projector that applies every event once, queries, rebuilds and the ledger's hash chain.
Imports: common, domain."""
