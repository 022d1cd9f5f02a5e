"""The topics the ledger names our classes by, those it stored before they moved included.

Until the model was split into one module per aggregate, its classes lived in ``domain.model``:
the events, the snapshots and the ``originator_topic`` of every ``Submitted``, ``Created`` and
``Registered`` event stored then name them ``domain.model:TrainingJob.Submitted``,
``domain.model:Node``, and so on. Each aggregate's old topic is registered with eventsourcing's
topic registry, so that it resolves to the moved class, and a name nested under it (an event
class, ``Started`` of either version included) to that class's attribute: ``resolve_topic``
looks up the longest registered prefix before importing a module. New events are stored under
the new topics (``domain.job:TrainingJob.Submitted``); a ledger holds both, and both load.

Since then every event of a job has an explicit topic (:data:`domain.job.TOPIC`), whichever
class or module its method sits in; the attempts' events, stored until then under the class
that held them (``domain.job_attempts:JobAttempts.Retried``), resolve to the job's as well.
"""

from __future__ import annotations

from eventsourcing.utils import get_topic, register_topic

from domain.job import TrainingJob
from domain.job_name import JobName
from domain.node import Node

OLD_TOPICS: dict[str, type] = {
    "domain.model:TrainingJob": TrainingJob,
    "domain.job_attempts:JobAttempts": TrainingJob,
    "domain.model:JobName": JobName,
    "domain.model:Node": Node,
}
"""Where each aggregate lived before the split, and the class it is now (and where a job's
attempts' events were stored before every event of a job had its explicit topic)."""

JOB_EVENT_TOPICS = (f"{get_topic(TrainingJob)}.", "domain.model:TrainingJob.",
                    "domain.job_attempts:JobAttempts.")  # fmt: skip
"""How the topic of a job's event begins, in a ledger written before the split or after."""


def register_old_topics() -> None:
    """Let the topics stored before the split resolve to the moved classes (idempotent)."""
    for topic, moved in OLD_TOPICS.items():
        register_topic(topic, moved)
