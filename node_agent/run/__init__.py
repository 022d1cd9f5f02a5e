"""Running a job's entry point: its command line and environment, the job user, the shim,
process groups, watching for its end or time limit, and adopting jobs an agent restart left.
Imports: common, node_agent.credentials, node_agent.jobdirs, node_agent.models,
node_agent.sandbox (its JobSandbox, named in a type)."""
