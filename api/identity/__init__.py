"""Who calls and what they keep: users, API and node tokens, the admin token file, and
users' secrets (encrypted at rest).
Imports: projections."""
