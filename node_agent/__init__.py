"""The node agent (``flexai agent``): runs the control plane's training jobs on this host.

``main`` parses the command line; ``agent`` registers the node and follows its assignments;
``supervisor`` carries one job through its stages, which share a ``jobstate``: ``building``
(through the ``build`` room: git, venv, pip, inputs), ``gate`` (``built``, then the control
plane's go), ``running`` (through the ``run`` room: command line, environment, process groups,
watching) and ``preemption``; ``shipping`` holds the job's ``logs`` shipper and ``artifacts``
uploader from its build to its end, then reports how it went (``reports``, through
``client``). ``models`` holds the wire's shapes they share, ``jobdirs`` each job's folders;
``debug`` opens SSH sessions into running jobs.
Imports: common."""
