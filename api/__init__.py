"""The control plane server (`flexai server`): its settings, the composition root that builds
every part (:mod:`api.services`), the job specs' service that submissions call
(:mod:`api.job_specs`), the runtimes admins name (:mod:`api.runtimes`), and its rooms by
concern: http, identity, ledger, scheduling, artifacts and debug.
Imports: common, domain, ledger, projections."""
