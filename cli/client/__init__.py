"""The one HTTP client of the CLI: :class:`cli.client.api.ApiClient`, a method per route of
the control plane's "Users" API, on the HTTP mechanics of :mod:`cli.client.http`.
Imports: cli.errors, common."""
