"""The ledger: where every event is stored and how a save is committed. The database
connections (SQLite, PostgreSQL through psycopg 3, the pool that fails fast while PostgreSQL is
away: ``database``, ``pool``), the event store's recorders with their hash chain (``chain``) and
group commit (``group_commit``), and how the server's tables are made (``schema``). The views
(:mod:`projections`) and the server (:mod:`api`) are built on it.
Imports: nothing of ours (the standard library, eventsourcing and psycopg only)."""
