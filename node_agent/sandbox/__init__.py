"""Each job in a sandbox of its own on this node: a user id no other live job has
(``identities``), namespaces and mounts set up by bubblewrap (``bwrap``) so it sees only its
own processes and files and the platform's paths, and a cgroup with memory and process limits
(``cgroups``). ``isolation`` says at start what this host allows, and what jobs share when it
cannot sandbox them.
Imports: common, node_agent.jobdirs, node_agent.models, node_agent.run."""
