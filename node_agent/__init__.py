"""The node agent (``flexai agent``): runs the control plane's training jobs on this host.

``main`` parses the command line; ``agent`` registers the node and follows its assignments;
``supervisor`` carries one job through its rooms: ``build`` (git, venv, pip, inputs), ``run``
(command line, environment, process groups, watching), ``logs`` and ``artifacts`` (what it
ships, through ``client``), then ``shipping`` reports how it went (``reports``). ``models`` holds
the wire's shapes they share, ``jobdirs`` each job's folders; ``debug`` opens SSH sessions
into running jobs.
Imports: common."""
