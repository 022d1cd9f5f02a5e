"""What a job leaves: its checkpoints and outputs, collected and uploaded.
Imports: node_agent.client."""
