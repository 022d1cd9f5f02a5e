"""Who calls and what they keep: users, API and node tokens, the admin token file, the web
console's sign-in sessions, and users' secrets (encrypted at rest).
Imports: ledger, projections."""
