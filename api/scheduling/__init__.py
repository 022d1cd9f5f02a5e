"""The fleet: the scheduler (placement, deadlines, lost nodes), the lock that makes one replica
lead, node heartbeats and holders, why jobs wait, and agents' long polls on their assignments.
Imports: api.settings, common, domain, ledger, projections."""
