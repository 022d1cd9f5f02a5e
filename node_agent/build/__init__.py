"""Building a job on this node: git mirrors and checkout, cached Python environments, datasets
and input checkpoints (safely unpacked), and the secrets fetched before the build.
Imports: common.contract, node_agent.client, node_agent.jobdirs, node_agent.models,
node_agent.run."""
