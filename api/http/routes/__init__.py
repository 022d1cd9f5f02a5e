"""The routes, one module per resource: they check the caller, call the application service
or read the views (a submission's spec: the job specs' service), and answer schemas or problem
details.
Imports: api.artifacts, api.debug, api.http, api.identity, api.job_specs, api.ledger, api.runtimes,
api.scheduling, api.services, common, domain, ledger, projections."""
