"""The views: the tables each event changes, the projector that applies every event once,
queries and rebuilds (the connections and the event store itself are the ledger's).
Imports: common, domain, ledger."""
