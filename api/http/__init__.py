"""The HTTP face of the control plane: the FastAPI app, routes, dependencies, problem
details, request limits and checks, schemas and metrics.
Imports: api.artifacts, api.console, api.debug, api.identity, api.job_specs, api.ledger,
api.runtimes, api.scheduling, api.services, api.settings, common, domain, ledger, projections."""
