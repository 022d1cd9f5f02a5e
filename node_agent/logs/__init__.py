"""A job's log on its way to the control plane: ordered, idempotent shipping, with secret
values masked out.
Imports: node_agent.client."""
