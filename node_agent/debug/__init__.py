"""Debug sessions into this node's running jobs: the SSH server reached through the control
plane's relay, and the commands it runs in a job's environment.
Imports: node_agent.client, node_agent.models, node_agent.run, node_agent.supervisor."""
