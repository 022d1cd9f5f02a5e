"""The node agent (``flexai agent``): runs the control plane's training jobs on this host.

``main`` parses the command line; ``agent`` registers the node and follows its assignments;
``supervisor`` carries one job through ``build`` (git, venv, pip, inputs), ``launch`` (command
line and environment) and ``processes`` (process groups), while ``logship`` and ``checkpoints``
send its output to the control plane through ``client``, and ``reports`` says how it went.
"""
