"""The statuses of a training job, as users see them (SPEC.md's lifecycle): the wire contract's
(:mod:`common.contract`), which the CLI and the agent read too; which transitions lead from
one to another is :mod:`domain.lifecycle`'s table."""

from __future__ import annotations

from common.contract import ON_A_NODE, TERMINAL, Status

__all__ = ["ON_A_NODE", "TERMINAL", "Status"]
