"""Reliability in CI (issue 7), the short version of tools/reliability.py (same code, one profile, ~4-5 min):

1. kimi_k3 deployed (stub workers with 200 ms latency, REAL sglang-router 0.3.2), a light chat-completion load
   (4 in flight) through the router; playbooks/rolling_restart.yml under that load completes (rc 0, both workers
   restarted: new MainPIDs) with 0 failed requests.
2. The last instance of the rolling order is armed with the stub fault `unhealthy` (its restarted process never
   answers /health): the rollout stops (rc != 0) with a message naming that instance, the instance stays out of the
   router, the router keeps answering (0 failed requests under load); the rerun for that instance alone, after the
   fault is cleared, brings it back.
3. An API key added to the serving fleet and removed again (issue 32), under the same load sent WITH the key: the
   router restarts to take or drop `--api-key` (sglang-router 0.3.2 reads it only at start) behind its HAProxy
   front, which retries the connections it refuses meanwhile, so 0 requests fail; every worker restarted one at a
   time; the key in no playbook output.
The sandbox is left as found: faults and latency cleared, every kimi_k3 instance listed healthy by the router.
"""

import json

import pytest

import reliability

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


@pytest.fixture(scope="module")
def bench(sandbox, tmp_path_factory):  # `sandbox` is unused by name: requesting it brings the fleet up
    opts = reliability.options(["--profiles", "kimi_k3", "--baseline-s", "8", "--tail-s", "3",
                                "--health-timeout-s", "20", "--max-load-s", "300", "--wait-idle-s", "120"])
    b = reliability.Bench(opts, tmp_path_factory.mktemp("reliability"))
    layout = reliability.profile_layout("kimi_k3")
    b.deploy(layout)
    b.clear_faults(layout)
    b.set_latency(layout, opts.latency_ms)
    assert b.wait_serving(layout, 120), reliability.router_workers(layout)
    yield b, layout
    b.clear_faults(layout)
    b.set_latency(layout, None)
    assert b.restore(layout), "kimi_k3 not fully serving after the test: %s" % reliability.router_workers(layout)


def _why(rec):
    """The record as text, failed requests first (pytest shortens a non-string message to a few hundred characters:
    CI once kept only 'http_502': 1 of a failure)."""
    keys = ("failures", "sent", "failed", "during", "playbooks", "restarted", "stopped_at")
    return json.dumps({k: rec.get(k) for k in keys}, default=str)[:6000]


def test_rolling_restart_under_load_zero_failures(bench):
    b, layout = bench
    (rec,) = b.s_rolling(layout)
    assert rec["playbooks"][0]["rc"] == 0, rec["playbooks"][0]
    assert rec["restarted"] == sorted(i["id"] for i in layout["instances"]), _why(rec)
    assert rec["during"]["sent"] > 20, _why(rec)     # the load really ran through the whole rollout
    assert rec["failed"] == 0, _why(rec)
    assert rec["pass"], _why(rec)


def test_never_healthy_worker_stops_rollout_router_keeps_answering(bench):
    b, layout = bench
    victim = layout["rolling_order"][-1]["id"]
    stop, recovery = b.s_unhealthy(layout)
    assert stop["playbooks"][0]["rc"] != 0, stop["playbooks"][0]
    assert stop["stopped_at"] == victim, _why(stop)
    assert any(victim in m and "Rolling restart stopped" in m for m in stop["playbooks"][0]["messages"]), \
        stop["playbooks"][0]["messages"]
    assert not stop["victim_in_router_after_stop"], _why(stop)
    assert stop["others_in_router_after_stop"] == sorted(i["id"] for i in layout["instances"] if i["id"] != victim)
    assert stop["during"]["sent"] > 20 and stop["failed"] == 0, _why(stop)
    assert recovery["playbooks"][0]["rc"] == 0 and recovery["all_serving_after"], _why(recovery)
    assert recovery["failed"] == 0, _why(recovery)


def test_api_key_added_and_removed_zero_failures_through_the_front(bench):
    b, layout = bench
    add, remove = b.s_key(layout)
    for rec, change in ((add, "add"), (remove, "remove")):
        assert rec["playbooks"][0]["rc"] == 0, rec["playbooks"][0]
        assert rec["key_change"] == change and not rec["key_in_log"], _why(rec)
        assert rec["restarted"] == sorted(i["id"] for i in layout["instances"]), _why(rec)
        assert rec["during"]["sent"] > 20, _why(rec)
        assert rec["failed"] == 0, _why(rec)       # before the front: thousands refused in the router's 1-1.5 s restart
        assert rec["pass"], _why(rec)
