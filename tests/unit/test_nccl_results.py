"""Tests for module_utils/health/nccl_results.py, plugins/modules/nccl_tests_result.py and the nccl_validation role's data.

REAL captures (sandbox/hwemu/real, via the real_fixtures fixture): 1xH200 and 2xH200 all_reduce_perf from
nccl-tests 2.19.6 / NCCL 2.28.9, text, JSON and NCCL_DEBUG=INFO runs. SYNTHESIZED outputs: tests/fixtures/nccl/
(see its README.md).
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.health.nccl_results import (
    GIB, analyze_repeat, classify, gate_rows, ib_hca_list, parse_json, parse_text, select_threshold,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
SYN = ROOT / "tests" / "fixtures" / "nccl"
ROLE = ROOT / "roles" / "nccl_validation"


@pytest.fixture(scope="module")
def table():
    return yaml.safe_load((ROLE / "vars" / "thresholds.yml").read_text())["nccl_validation_threshold_table"]


@pytest.fixture(scope="module")
def h200(real_fixtures):
    d = real_fixtures / "nvidia-h200-vm"
    return {k: (d / f).read_text() for k, f in (("g1", "all_reduce_g1.txt"), ("g1_json", "ar-g1.json"),
                                                  ("g1_debug", "all_reduce_g1_debug.txt"), ("bf16", "all_reduce_bf16.txt"))}


@pytest.fixture(scope="module")
def h200x2(real_fixtures):
    d = real_fixtures / "nvidia-h200x2-vm"
    return {k: (d / f).read_text() for k, f in (("gN", "all_reduce_gN.txt"), ("gN_json", "ar-gN.json"),
                                                  ("gN_debug", "all_reduce_gN_debug.txt"))}


def syn(name):
    return (SYN / (name + ".txt")).read_text(), (SYN / (name + ".json")).read_text()


def rep(name, rc=0, timed_out=False, threshold=None, index=1):
    txt, js = syn(name)
    return analyze_repeat(index, rc, timed_out, txt, js, threshold)


# ------------------------------------------------------------------------------------------ real captures: parsing
def test_real_g1_text_header_table_footer(h200):
    p = parse_text(h200["g1"])
    assert p["version"] == "2.19.6" and p["nccl_headers"] == 22809
    assert p["collective"] == "all_reduce_perf" and p["concluded"]
    assert (p["nthreads"], p["ngpus"], p["min_bytes"], p["max_bytes"]) == (1, 1, 8, 4294967296)
    assert p["iters"] == 20 and p["warmup_iters"] == 1
    assert p["ranks"] == [{"rank": 0, "group": 0, "pid": 1259, "host": "vm", "device": 0, "bus_id": "0000:00:06",
                           "gpu_name": "NVIDIA H200"}]
    assert len(p["rows"]) == 30
    assert p["rows"][0]["size"] == 8 and p["rows"][-1]["size"] == 4 * GIB
    assert p["rows"][-1]["out_of_place"] == {"time_us": 2007.37, "algbw": 2139.6, "busbw": 0.0, "wrong": 0.0}
    assert p["rows"][-1]["in_place"]["algbw"] == 3e6  # "3e+06": in-place on one rank is a no-op
    assert p["out_of_bounds"] == {"count": 0, "ok": True}
    assert p["avg_busbw"] == 0.0 and p["avg_bw_check"] is None


def test_real_g1_json_matches_text(h200):
    j = parse_json(h200["g1_json"])
    t = parse_text(h200["g1"])
    assert j["valid"] and j["ngpus"] == 1 and j["nccl_version"] == 22809
    assert [r["size"] for r in j["rows"]] == [r["size"] for r in t["rows"]]
    assert j["rows"][-1]["out_of_place"]["algbw"] == pytest.approx(2139.599758)
    assert j["rows"][-1]["root"] == -1  # JSON keeps the padded string "    -1"
    assert j["out_of_bounds"] == {"count": 0, "ok": True}
    assert j["avg_bw_check"] is None and j["errors"] == []


def test_real_gN_text_and_json_agree(h200x2):
    t = parse_text(h200x2["gN"])
    j = parse_json(h200x2["gN_json"])
    assert t["ngpus"] == 2 and len(t["ranks"]) == 2 and {r["bus_id"] for r in t["ranks"]} == {"0000:00:06", "0000:00:07"}
    assert len(t["rows"]) == len(j["rows"]) == 30
    for a, b in zip(t["rows"], j["rows"]):
        assert a["size"] == b["size"]
        assert a["out_of_place"]["busbw"] == pytest.approx(b["out_of_place"]["busbw"], abs=0.006)
    assert t["avg_busbw"] == pytest.approx(103.603)


def test_real_debug_outputs_with_interleaved_info_lines(h200, h200x2):
    for text, ngpus, info_min in ((h200["g1_debug"], 1, 80), (h200x2["gN_debug"], 2, 100)):
        p = parse_text(text)
        assert p["info_lines"] >= info_min
        assert [r["size"] for r in p["rows"]] == [1048576, 4194304, 16777216, 67108864]
        assert p["ngpus"] == ngpus and p["concluded"] and p["out_of_bounds"]["ok"]
    gn = parse_text(h200x2["gN_debug"])
    assert gn["rows"][-1]["out_of_place"]["busbw"] == 267.29


def test_real_bf16_type_column(h200):
    p = parse_text(h200["bf16"])
    assert {r["type"] for r in p["rows"]} == {"bfloat16"} and len(p["rows"]) == 25


# ------------------------------------------------------------------------------------------ real captures: verdicts
def test_real_1gpu_busbw_zero_is_not_slow_with_default_table(h200, table):
    th = select_threshold(table, "NVIDIA H200", 1)
    assert th["id"] == "any-1gpu" and th["metric"] == "algbw" and th["min_gbps"] is None
    r = analyze_repeat(1, 0, False, h200["g1"], h200["g1_json"], th)
    assert r["status"] == "ok" and r["rule"] == "correctness_only"
    assert r["max_size_busbw_gbps"] == 0.0
    # gated on out-of-place algbw over 1/2/4 GiB (median = the 2 GiB value), not on the 3e+06 in-place no-op
    assert r["gate_sizes"] == [GIB, 2 * GIB, 4 * GIB]
    assert r["gated_gbps"] == pytest.approx(2132.716, abs=0.001)
    v = classify([r, dict(r, index=2), dict(r, index=3)], th, gpu_count=1)
    assert v["status"] == "ok" and v["threshold_gbps"] is None


def test_real_1gpu_would_be_slow_if_gated_on_busbw(h200):
    # why the 1-GPU rule exists: with a busbw floor, one GPU always fails
    r = analyze_repeat(1, 0, False, h200["g1"], h200["g1_json"], {"metric": "busbw", "min_gbps": 1.0})
    assert r["status"] == "slow" and r["gated_gbps"] == 0.0


def test_real_2gpu_numbers_and_threshold(h200x2, table):
    th = select_threshold(table, "NVIDIA H200", 2)
    assert th["id"] == "h200x2-nv18-nvls-off" and th["min_gbps"] == 305.0
    r = analyze_repeat(1, 0, False, h200x2["gN"], h200x2["gN_json"], th)
    assert r["status"] == "ok" and r["rows_source"] == "json"
    assert r["max_size"] == 4 * GIB and r["max_size_busbw_gbps"] == pytest.approx(343.938, abs=0.001)
    assert r["gate_values"] == pytest.approx([326.81116, 339.757442, 343.938217])
    assert r["gated_gbps"] == pytest.approx(339.757, abs=0.001)
    assert r["avg_busbw_all_sizes"] == pytest.approx(103.603, abs=0.001)  # reported, never gated


def test_real_2gpu_debug_gates_top3_when_no_size_reaches_1gib(h200x2):
    g = gate_rows(parse_text(h200x2["gN_debug"])["rows"], "busbw", GIB, 3)
    assert g["sizes"] == [4194304, 16777216, 67108864] and g["gated"] == 211.81


def test_real_2gpu_below_a_raised_floor_is_slow(h200x2):
    r = analyze_repeat(1, 0, False, h200x2["gN"], h200x2["gN_json"], {"metric": "busbw", "min_gbps": 370})
    assert r["status"] == "slow" and r["rule"] == "below_threshold" and "339.757" in r["detail"]


# ------------------------------------------------------------------------------------------ synthesized: per repeat
def test_syn_ok_with_glued_info_line(table):
    th = select_threshold(table, "NVIDIA B300 SXM6 AC", 8)
    assert th["id"] == "b300x8-nvls-off" and th["min_gbps"] == 630.0
    txt, _ = syn("b300x8_ok")
    text_only = parse_text(txt)
    assert GIB in [r["size"] for r in text_only["rows"]]  # the row after the newline-less INFO fragment
    assert len(text_only["rows"]) == 31 and text_only["info_lines"] >= 10
    r = rep("b300x8_ok", threshold=th)
    assert r["status"] == "ok" and r["gate_sizes"] == [GIB, 2 * GIB, 4 * GIB, 8 * GIB]
    assert 780 < r["gated_gbps"] < 810 and r["ranks"] == 8 and r["gpu_names"] == ["NVIDIA B300 SXM6 AC"]


def test_syn_slow(table):
    th = select_threshold(table, "NVIDIA B300 SXM6 AC", 8)
    r = rep("b300x8_slow", threshold=th)
    assert r["status"] == "slow" and r["rule"] == "below_threshold" and r["gated_gbps"] < 630


def test_syn_wrong_results_beats_everything():
    r = rep("b300x8_wrong", rc=1, threshold={"metric": "busbw", "min_gbps": 630})
    assert r["status"] == "wrong_results" and r["wrong_total"] == 15
    assert r["out_of_bounds"] == {"count": 15, "ok": False}
    assert "256 MiB" in r["detail"] and "512 MiB" in r["detail"]


def test_syn_wrong_results_from_footer_alone():
    txt = "\n".join(ln for ln in syn("b300x8_ok")[0].splitlines() if "Out of bounds" not in ln)
    txt += "\n# Out of bounds values : 4 FAILED\n"
    r = analyze_repeat(1, 1, False, txt, None, {"metric": "busbw", "min_gbps": 630})
    assert r["status"] == "wrong_results" and r["wrong_total"] == 0 and r["out_of_bounds"]["count"] == 4


def test_syn_hang_truncated_text_and_json():
    txt, js = syn("b300x8_hang")
    assert parse_json(js)["valid"] is False
    r = analyze_repeat(2, 124, True, txt, js, {"metric": "busbw", "min_gbps": 630})
    assert r["status"] == "hang" and r["rule"] == "timeout"
    assert r["rows_source"] == "text" and r["last_size"] == 64 << 20 and "64 MiB" in r["detail"]
    # timed_out inferred from timeout(1)'s exit codes when the caller does not say
    assert analyze_repeat(2, 137, None, txt, js)["status"] == "hang"


def test_syn_truncated_without_timeout_is_error():
    txt, js = syn("b300x8_hang")
    r = analyze_repeat(1, 0, False, txt, js)
    assert r["status"] == "error" and r["rule"] == "truncated"


def test_syn_nccl_failure_is_error():
    txt, js = syn("b300x8_nccl_error")
    r = analyze_repeat(1, 3, False, txt, js)
    assert r["status"] == "error" and r["rule"] == "exit_status"
    assert "Test NCCL failure common.cu:1190" in r["detail"]


def test_missing_binary_and_missing_output_are_errors():
    r = analyze_repeat(1, 127, False, "timeout: failed to run command '/opt/x/all_reduce_perf': No such file or directory\n", None)
    assert r["status"] == "error" and "not found" in r["detail"]
    r = analyze_repeat(1, None, None, None, None, stdout_missing=True)
    assert r["status"] == "error" and r["rule"] == "no_output"


def test_nccl_tests_min_bw_failure_is_slow_not_error():
    txt = syn("b300x8_slow")[0].replace("# Avg bus bandwidth    : ", "# Avg bus bandwidth    : ").replace(
        "\n#\n# Collective test concluded", " FAILED\n#\n# Collective test concluded", 1)
    lines = txt.splitlines()
    lines = [ln + " FAILED" if ln.startswith("# Avg bus bandwidth") else ln for ln in lines]
    r = analyze_repeat(1, 1, False, "\n".join(lines), None, {"metric": "busbw", "min_gbps": 630})
    assert r["status"] == "slow" and r["rule"] == "nccl_tests_min_bw"


def test_syn_two_node_ring_thresholds(table):
    th = select_threshold(table, "NVIDIA B300 SXM6 AC", 8, nodes=2, nic_count=8, nic_rate_gbps=400)
    assert th["id"] == "ib-ring-2node" and th["min_gbps"] == pytest.approx(331.2) and th["expected_gbps"] == 368
    ok = rep("twonode_ring_ok", threshold=th)
    slow = rep("twonode_ring_slow", threshold=th)
    assert ok["status"] == "ok" and ok["ranks"] == 16 and ok["ngpus"] == 1
    assert slow["status"] == "slow" and slow["gated_gbps"] < 331.2


# ------------------------------------------------------------------------------------------ verdict over K repeats
@pytest.fixture()
def reps():
    th = {"id": "b300x8-nvls-off", "metric": "busbw", "min_gbps": 630.0}
    txt_hang, js_hang = syn("b300x8_hang")
    return {
        "th": th,
        "ok": lambda i: rep("b300x8_ok", threshold=th, index=i),
        "slow": lambda i: rep("b300x8_slow", threshold=th, index=i),
        "wrong": lambda i: rep("b300x8_wrong", rc=1, threshold=th, index=i),
        "hang": lambda i: analyze_repeat(i, 124, True, txt_hang, js_hang, th),
        "err": lambda i: analyze_repeat(i, 3, False, *syn("b300x8_nccl_error"), threshold=th),
    }


def _seq(reps, *kinds):
    return [reps[k](i) for i, k in enumerate(kinds, start=1)]


def test_verdict_all_ok_carries_the_numbers(reps):
    v = classify(_seq(reps, "ok", "ok", "ok"), reps["th"], gpu_count=8)
    assert v["status"] == "ok" and v["rule"] == "within_threshold" and v["baseline_update"]
    assert v["threshold_gbps"] == 630.0 and v["metric"] == "busbw" and v["repeats_total"] == 3
    assert len(v["per_repeat_max_size_busbw_gbps"]) == 3 and v["max_size"] == 8 * GIB
    assert v["gated_gbps"] == v["per_repeat_gated_gbps"][0]


def test_verdict_intermittent_two_ok_one_hang(reps):
    v = classify(_seq(reps, "ok", "hang", "ok"), reps["th"], gpu_count=8)
    assert v["status"] == "intermittent" and v["rule"] == "mixed_outcomes"
    assert v["counts"] == {"ok": 2, "hang": 1} and v["per_repeat_status"] == ["ok", "hang", "ok"]
    assert "2 ok, 1 hang" in v["message"] and not v["baseline_update"]
    assert v["gated_gbps"] is not None  # the completed repeats still report their figure


def test_verdict_intermittent_error_and_slow(reps):
    v = classify(_seq(reps, "slow", "err", "ok"), reps["th"], gpu_count=8)
    assert v["status"] == "intermittent"


def test_verdict_all_hang_and_all_error(reps):
    assert classify(_seq(reps, "hang", "hang", "hang"), reps["th"], gpu_count=8)["status"] == "hang"
    assert classify(_seq(reps, "hang", "err", "hang"), reps["th"], gpu_count=8)["status"] == "hang"
    v = classify(_seq(reps, "err", "err", "err"), reps["th"], gpu_count=8)
    assert v["status"] == "error" and v["gated_gbps"] is None


def test_verdict_wrong_results_anywhere_wins(reps):
    v = classify(_seq(reps, "ok", "wrong", "hang"), reps["th"], gpu_count=8)
    assert v["status"] == "wrong_results" and "1/3" in v["message"]


def test_verdict_slow_on_median_not_on_one_repeat(reps):
    assert classify(_seq(reps, "ok", "slow", "ok"), reps["th"], gpu_count=8)["status"] == "ok"
    v = classify(_seq(reps, "slow", "slow", "ok"), reps["th"], gpu_count=8)
    assert v["status"] == "slow" and v["rule"] == "below_threshold" and v["gated_gbps"] < 630


def test_regression_against_baseline(reps):
    seq = _seq(reps, "ok", "ok", "ok")
    gated = seq[0]["gated_gbps"]
    base = {"gated_gbps": round(gated / 0.85, 3), "metric": "busbw", "gpu_count": 8, "nodes": 1, "run_id": "r0"}
    v = classify(seq, reps["th"], gpu_count=8, baseline=base, max_drop_pct=10)
    assert v["status"] == "slow" and v["rule"] == "regression" and not v["baseline_update"]
    assert v["regression"]["fired"] and v["regression"]["drop_pct"] == pytest.approx(15.0, abs=0.05)
    # within the allowed drop
    v = classify(seq, reps["th"], gpu_count=8, baseline=dict(base, gated_gbps=gated * 1.05), max_drop_pct=10)
    assert v["status"] == "ok" and v["regression"]["compared"] and not v["regression"]["fired"] and v["baseline_update"]
    # a baseline of another shape (GPU count) is not comparable
    v = classify(seq, reps["th"], gpu_count=8, baseline=dict(base, gpu_count=4), max_drop_pct=10)
    assert v["status"] == "ok" and not v["regression"]["compared"]


def test_no_repeats_is_error():
    assert classify([], {})["status"] == "error"


# ------------------------------------------------------------------------------------------ thresholds and NICs
def test_threshold_selection(table):
    assert select_threshold(table, "NVIDIA H200", 8)["min_gbps"] == 333.0
    assert select_threshold(table, "NVIDIA H100 80GB HBM3", 8)["min_gbps"] == 333.0
    assert select_threshold(table, "NVIDIA B300 SXM6 AC", 1)["metric"] == "algbw"
    assert select_threshold(table, "NVIDIA B300 SXM6 AC", 4) is None  # no published figure: preflight asks for one
    assert select_threshold(table, "x", 8, nodes=2, nic_count=8, nic_rate_gbps=800)["min_gbps"] == pytest.approx(662.4)
    assert select_threshold(table, "x", 8, nodes=2, nic_count=8, nic_rate_gbps=200) is None
    override = {"single_node": [{"id": "site", "gpu_match": "B300", "gpu_count": 8, "min_gbps": 700}]}
    merged = {"single_node": override["single_node"] + table["single_node"], "multi_node": table["multi_node"]}
    assert select_threshold(merged, "NVIDIA B300 SXM6 AC", 8)["id"] == "site"


def test_threshold_table_documents_every_entry(table):
    for entry in table["single_node"] + table["multi_node"]:
        assert entry.get("id") and entry.get("source") and entry.get("reasoning"), entry


def test_ib_hca_exact_match_without_fabric_manager():
    devices = [{"name": "mlx5_0", "role": "data"}, {"name": "mlx5_1", "role": "data"},
               {"name": "mlx5_8", "role": "fabric_manager"}]
    assert ib_hca_list(devices, ["mlx5_1", "mlx5_0", "mlx5_8"]) == "=mlx5_0,mlx5_1"
    assert ib_hca_list(devices, []) == ""


# ------------------------------------------------------------------------------------------ role data in sync
def test_argument_specs_in_sync_with_defaults():
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert set(defaults) == set(specs)
    for k, v in defaults.items():
        if k != "nccl_validation_artifacts_dir":
            assert specs[k]["default"] == v, k
        assert specs[k]["description"], k


# ------------------------------------------------------------------------------------------ repeat wrapper script
WRAPPER = ROLE / "files" / "nccl_repeat.sh"


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout missing")
def test_repeat_wrapper_records_rc_output_and_timeouts(tmp_path):
    p = str(tmp_path / "r")
    subprocess.run(["sh", str(WRAPPER), p, "5", "1", "--", "sh", "-c", "echo row; echo err >&2; exit 3"], check=True)
    assert json.loads(open(p + ".meta.json").read())["rc"] == 3
    assert open(p + ".out").read() == "row\nerr\n"
    subprocess.run(["sh", str(WRAPPER), p, "1", "1", "--", "sleep", "30"], check=True)
    meta = json.loads(open(p + ".meta.json").read())
    assert meta["timed_out"] is True and meta["rc"] == 124 and meta["duration_s"] <= 3
    subprocess.run(["sh", str(WRAPPER), p, "5", "1", "--", str(tmp_path / "no-such-binary")], check=True)
    meta = json.loads(open(p + ".meta.json").read())
    assert meta["rc"] == 127 and meta["timed_out"] is False
    r = analyze_repeat(1, meta["rc"], meta["timed_out"], open(p + ".out").read(), None)
    assert r["status"] == "error" and "not found" in r["detail"]


# ------------------------------------------------------------------------------------------ the module itself
def _ansible(*args):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_LOCALHOST_WARNING="false",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="false", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1")
    bindir = os.path.dirname(sys.executable)
    return subprocess.run([os.path.join(bindir, args[0])] + list(args[1:]), cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=120)


def test_ansible_doc_renders():
    r = _ansible("ansible-doc", "b300.rollout.nccl_tests_result")
    assert r.returncode == 0, r.stderr
    assert "output_prefixes" in r.stdout and "regression_max_drop_pct" in r.stdout


def test_module_classifies_files_written_by_the_wrapper(tmp_path, h200x2, table):
    for i, (rc, to) in enumerate(((0, False), (124, True), (0, False)), start=1):
        pre = tmp_path / ("single-%d" % i)
        if to:
            pre.with_suffix(".out").write_text(h200x2["gN"].split("# Out of bounds")[0].rsplit("\n", 8)[0] + "\n")
        else:
            (tmp_path / ("single-%d.out" % i)).write_text(h200x2["gN"])
            (tmp_path / ("single-%d.json" % i)).write_text(h200x2["gN_json"])
        (tmp_path / ("single-%d.meta.json" % i)).write_text(json.dumps({"rc": rc, "timed_out": to, "duration_s": 4}))
    args = {"output_prefixes": [str(tmp_path / ("single-%d" % i)) for i in (1, 2, 3)], "gpu_name": "NVIDIA H200",
            "gpu_count": 2, "threshold_table": table}
    r = _ansible("ansible", "localhost", "-i", "localhost,", "-c", "local", "-m", "b300.rollout.nccl_tests_result",
                 "-e", "ansible_python_interpreter=" + sys.executable, "-a", json.dumps(args))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout.split("=>", 1)[1])
    v = res["verdict"]
    assert res["threshold"]["id"] == "h200x2-nv18-nvls-off"
    assert v["status"] == "intermittent" and v["per_repeat_status"] == ["ok", "hang", "ok"]
    assert v["gated_gbps"] == pytest.approx(339.757, abs=0.001) and v["threshold_gbps"] == 305.0
    assert v["repeats"][1]["timed_out"] and v["repeats"][0]["duration_s"] == 4
