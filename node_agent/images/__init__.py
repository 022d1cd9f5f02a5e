"""Container images a job runs in, pulled and cached by this node: a reference parsed
(``reference``), pulled with skopeo into an OCI layout, with the registry's answer said plainly
when it fails (``pull``), unpacked with umoci once per manifest digest into a cache the jobs
share, read-only to them and bounded in size (``cache``), all of it behind ``ensure_image``
(``ensure``); ``flags`` are ``flexai agent``'s.
Imports: node_agent.build.filelock, node_agent.run.processes."""
