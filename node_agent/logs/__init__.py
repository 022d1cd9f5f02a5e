"""A job's log on its way to the control plane: ordered, idempotent shipping, with secret
values masked out.
Imports: common, node_agent.client."""
