"""Integration: playbooks/nccl_validation.yml on the two sandbox hosts (emulated B300 + CX8, SYNTHESIZED numbers).

The hwemu all_reduce_perf / mpirun stand-ins (sandbox/hwemu/README.md) implement the scenarios:
healthy ~870 GB/s one node and ~371 GB/s two-node Ring; nccl_slow ~300 / ~118; nccl_wrong_results #wrong at
8-64 MiB (footer FAILED, rc 1); nccl_intermittent_hang: the 2nd invocation since the scenario switch hangs.

Run 1: b300a healthy, b300b nccl_slow            -> a ok, b slow, two-node (driven from a) ok; only b fails.
Run 2: b300a nccl_wrong_results, b300b nccl_intermittent_hang (2 s hang timeout)
                                                 -> a wrong_results, b intermittent (ok, hang, ok), two-node wrong.
Run 3: -l b300a only, healthy, baseline raised 1.5x -> two-node run skipped with a message, a slow by regression.
A finalizer puts both hosts back to healthy.
"""
import json

import pytest

HOSTS = ("b300a", "b300b")
MULTI = "multinode-b300a+b300b"
FAST = ["-e", "nccl_validation_run_timeout_s=3", "-e", "nccl_validation_kill_after_s=2",
        "-e", "nccl_validation_results_dir=/tmp/nccl-validation-test"]


def current(sb):
    """Scenario of each host after a run: the sandbox is shared, so check nobody switched it under us."""
    return {h: sb.current_scenario(h) for h in HOSTS}


def play(sb, art, limit="b300a,b300b", extra=()):
    argv = ["ansible-playbook", "playbooks/nccl_validation.yml", "-i", "inventory/sandbox", "-l", limit,
            "-e", "nccl_validation_artifacts_dir=%s" % art,
            # other tests may have left SGLang serving on the shared fleet: validate anyway (maintenance-window switch)
            "-e", "nccl_validation_when_serving=true"] + FAST + list(extra)
    r = sb.run(argv, check=False, timeout=600)
    return {"rc": r.returncode, "out": r.stdout + r.stderr}


def verdicts(art, key):
    """Verdict files of one host (or the two-node key), oldest first (run ids are UTC timestamps)."""
    d = art / key
    files = sorted(p for p in d.glob("2*.json")) if d.is_dir() else []
    return [json.loads(p.read_text()) for p in files]


@pytest.fixture(scope="module")
def fleet(sandbox, request):
    sandbox.scenarios_back_to_healthy(request, HOSTS)
    return sandbox


@pytest.fixture(scope="module")
def runs(fleet, tmp_path_factory):
    sb = fleet
    art = tmp_path_factory.mktemp("nccl")
    out = {"art": art}
    sb.scenario("b300a", "healthy")
    sb.scenario("b300b", "nccl_slow")
    out["run1"] = play(sb, art)
    out["scenarios1"] = current(sb)
    out["after1"] = {k: verdicts(art, k) for k in HOSTS + (MULTI,)}
    out["baseline_a_1"] = json.loads((art / "b300a" / "baseline.json").read_text())
    sb.scenario("b300a", "nccl_wrong_results")
    sb.scenario("b300b", "nccl_intermittent_hang")
    out["run2"] = play(sb, art)
    out["scenarios2"] = current(sb)
    out["after2"] = {k: verdicts(art, k) for k in HOSTS + (MULTI,)}
    out["baseline_a_2"] = json.loads((art / "b300a" / "baseline.json").read_text())
    sb.scenario("b300a", "healthy")
    raised = dict(out["baseline_a_2"], gated_gbps=round(out["baseline_a_2"]["gated_gbps"] * 1.5, 3), run_id="raised")
    (art / "b300a" / "baseline.json").write_text(json.dumps(raised))
    out["run3"] = play(sb, art, limit="b300a")
    out["after3"] = verdicts(art, "b300a")
    out["multi_after3"] = verdicts(art, MULTI)
    return out


def test_run1_healthy_ok_slow_detected(runs):
    r = runs["run1"]
    assert runs["scenarios1"] == {"b300a": "healthy", "b300b": "nccl_slow"}, "sandbox scenario switched by another run"
    a, b, m = runs["after1"]["b300a"][-1], runs["after1"]["b300b"][-1], runs["after1"][MULTI][-1]
    assert a["status"] == "ok", a["message"]
    assert a["threshold"]["id"] == "b300x8-nvls-off" and a["threshold_gbps"] == 630.0
    assert a["gated_gbps"] > 800 and a["gpu_count"] == 8 and a["repeats_total"] == 3
    assert a["gate_sizes"][0] == 1 << 30 and a["command"][1:3] == ["-g", "8"]
    assert a["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert b["status"] == "slow" and b["rule"] == "below_threshold" and b["gated_gbps"] < 630
    assert len(b["per_repeat_max_size_busbw_gbps"]) == 3
    assert m["status"] == "ok", m["message"]
    assert m["nodes"] == 2 and m["threshold"]["id"] == "ib-ring-2node" and m["threshold_gbps"] == pytest.approx(331.2)
    assert m["env"]["NCCL_ALGO"] == "Ring"
    assert m["env"]["NCCL_IB_HCA"] == "=" + ",".join("mlx5_%d" % i for i in range(8))  # no fabric-manager mlx5_8
    cmd = m["command"]
    assert cmd[0].endswith("mpirun") and cmd[cmd.index("-np") + 1] == "16" and cmd[cmd.index("-N") + 1] == "8"
    assert cmd[cmd.index("-H") + 1] == "10.89.30.11:8,10.89.30.12:8"
    assert r["rc"] != 0 and "NCCL validation failed on b300b" in r["out"] and "SLOW" in r["out"]
    assert "NCCL validation failed on b300a" not in r["out"]
    # raw outputs fetched per repeat, baseline written only for ok results
    raw = runs["art"] / "b300a" / a["run_id"]
    assert sorted(p.name for p in raw.iterdir()) == sorted(
        "single-%d%s" % (i, s) for i in (1, 2, 3) for s in (".out", ".json", ".meta.json"))
    assert runs["baseline_a_1"]["gated_gbps"] == a["gated_gbps"]
    assert not (runs["art"] / "b300b" / "baseline.json").exists()


def test_run2_wrong_results_and_intermittent_hang(runs):
    r = runs["run2"]
    assert runs["scenarios2"] == {"b300a": "nccl_wrong_results", "b300b": "nccl_intermittent_hang"}, (
        "sandbox scenario switched by another run")
    a, b, m = runs["after2"]["b300a"][-1], runs["after2"]["b300b"][-1], runs["after2"][MULTI][-1]
    assert a["status"] == "wrong_results" and a["counts"] == {"wrong_results": 3}
    assert "8 MiB" in a["message"]
    assert b["status"] == "intermittent" and b["per_repeat_status"] == ["ok", "hang", "ok"], b["message"]
    assert b["repeats"][1]["timed_out"] and b["repeats"][1]["rc"] == 124
    assert m["status"] == "wrong_results"
    assert r["rc"] != 0 and "WRONG_RESULTS" in r["out"] and "INTERMITTENT" in r["out"]
    # baseline only moves on ok verdicts
    assert runs["baseline_a_2"] == runs["baseline_a_1"]


def test_run3_single_host_skips_two_node_and_catches_regression(runs):
    r = runs["run3"]
    a = runs["after3"][-1]
    assert "two-node all_reduce_perf skipped - the play has 1 host(s)" in r["out"]
    assert len(runs["multi_after3"]) == 2  # run 3 added no two-node verdict
    assert a["status"] == "slow" and a["rule"] == "regression", a["message"]
    assert a["regression"]["fired"] and a["regression"]["drop_pct"] > 30
    assert a["regression"]["baseline_run_id"] == "raised"
    assert r["rc"] != 0
