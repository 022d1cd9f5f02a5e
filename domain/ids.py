"""The ids derived from names (a job name's holder, a node, a checkpoint), so that the same
name always finds the same aggregate: changing the namespace would orphan every one stored."""

from __future__ import annotations

from uuid import UUID

NAMESPACE = UUID("6f1d1c3e-2b9a-4f5e-9a51-3c1f0e8d7a42")
