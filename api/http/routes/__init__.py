"""The routes, one module per resource: they check the caller, call the application service
or read the views, and answer schemas or problem details.
Imports: api.artifacts, api.debug, api.http, api.identity, api.ledger, api.scheduling,
api.services, common.contract, domain, projections."""
