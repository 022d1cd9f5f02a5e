"""One classification of failures: whose they are, the infrastructure's or the user's.

A failure of the infrastructure is one the job did nothing to cause: its node was lost (however
that was found out: the server's lease, the agent's restart, the node leaving), its accelerator
failed, its image could not be pulled. A job with retries left is always retried on one
(``Retried``, resuming from its last checkpoint), whoever notices it first; only once its
retries are spent does it fail, and then it says the fleet failed it, not its code.

A failure of the user is one the job's own spec or code caused: an exit code it does not retry
on, a revision or a requirements file that is not there, an install that failed, its time limit,
running out of memory. It is retried only on the exit codes the job names
(``--retry-on-exit-codes``). A code this table does not know is the user's: retrying it could
loop for ever.

Imports: nothing of the domain.
"""

from __future__ import annotations

from enum import StrEnum


class FailureKind(StrEnum):
    INFRASTRUCTURE = "infrastructure"
    USER = "user"


INFRASTRUCTURE_FAILURES = frozenset({
    "node_lost",  # the server's lease ran out, the agent restarted, the node left
    "accelerator_error",  # an accelerator failed under the job (Xid, ECC)
    "image_pull_failed",  # the job's runtime image could not be pulled
    "secret_unavailable",  # the node could not fetch the job's secrets from the control plane
    "dataset_unavailable",  # nor download a dataset, or unpack it for want of disk
    "no_node_available",  # (rejected) no live node could take it within the patience
})  # fmt: skip
USER_FAILURES = frozenset({
    "entry_point_failed", "entry_point_not_found", "time_limit_exceeded", "out_of_memory",
    "clone_failed", "revision_not_found", "requirements_not_found", "dependency_install_failed",
    "secret_not_found", "dataset_not_found", "checkpoint_not_found", "checkpoint_invalid",
    "no_node_meets_request",
})  # fmt: skip
"""Listed to say so (a test finds every code the agent and the scheduler send in one of the
two); any code not in INFRASTRUCTURE_FAILURES is the user's. A stop that failed is no failure
of an attempt: it has no kind."""


def failure_kind(code: str) -> FailureKind:
    """Whose failure ``code`` is."""
    if code in INFRASTRUCTURE_FAILURES:
        return FailureKind.INFRASTRUCTURE
    return FailureKind.USER


def is_infrastructure(code: str) -> bool:
    return code in INFRASTRUCTURE_FAILURES

