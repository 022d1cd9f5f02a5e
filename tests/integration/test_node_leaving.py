"""An agent that stops (SIGTERM) ends its jobs' processes, then says so: its node takes no new
job, and its jobs move on at once, not when the node's lease runs out (each store)."""

from __future__ import annotations

from collections.abc import Callable
from uuid import UUID

from domain.statuses import Status
from tests.integration.test_api_problems import assert_problem
from tests.integration.test_hostile_requests import AGENT_A, AGENT_B, Api, open_api

__all__ = ["open_api"]  # its fixture applies here too


def test_a_node_whose_agent_leaves_takes_no_job_and_its_jobs_move_on_at_once(
    open_api: Callable[..., Api],
) -> None:
    api = open_api(node_timeout_s=3600)  # the lease alone would keep them for an hour
    running, node_id = api.running_job("runner")
    stopping, _ = api.running_job("stopper")
    stop = api.client.post("/v1/jobs/stopper/stop", headers=api.headers)
    assert stop.status_code == 202, stop.text
    assert node_id in api.services.state.live_nodes(3600)

    left = api.client.post(f"/v1/agent/nodes/{node_id}/leave", headers=api.agent_headers())
    assert left.status_code == 200, left.text
    assert left.json() == {"jobs": 2}

    runner = api.services.jobs.job(UUID(running))
    assert runner.status == Status.FAILED and runner.failure is not None
    assert runner.failure["code"] == "node_lost"
    assert runner.failure["message"].startswith("the agent of node gpu-1 stopped at ")
    assert runner.failure["message"].endswith("and ended the job's processes there")
    assert api.services.jobs.job(UUID(stopping)).status == Status.STOPPED  # not stop failed
    assert node_id not in api.services.state.live_nodes(3600)

    late = api.client.post(f"/v1/agent/nodes/{node_id}/heartbeat", headers=api.agent_headers())
    assert_problem(late, 404, "node-not-found")  # the agent that left holds nothing
    assert api.register(agent_id=AGENT_B).status_code == 200  # no lease to wait out
    again = api.client.post(f"/v1/agent/nodes/{node_id}/leave",
                            headers=api.agent_headers(AGENT_A))  # fmt: skip
    assert_problem(again, 409, "node-taken")  # only the holder speaks for the node
