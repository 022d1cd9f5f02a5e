"""What a job leaves: its checkpoints and outputs, zipped as a stream and uploaded in parts.
Imports: common (hashing beside the stream, attempts' queries), node_agent.client."""
