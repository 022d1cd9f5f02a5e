"""What the CLI, the server and the agent all use: the wire contract (``contract``: headers,
statuses, names' rules and limits, of the standard library alone, so the domain takes it too),
durations, the client config file, and downloads of artifacts that resume and verify
(``transfer``, on httpx, its bytes read by ``direct`` into the buffers of ``landing``;
``behind``: hashing beside the stream), how values and a waiting job's reasons read
(``wording``), and what names a job's attempts: their artifacts' keys, files and queries
(``attempts``).
Imports: nothing of ours (the standard library and httpx only)."""
