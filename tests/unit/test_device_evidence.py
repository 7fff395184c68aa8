"""Re-check the REAL 2xH200 evidence (docs/evidence/h200x2/) with the project's own parsers.

These files came from the lent GPU machine (see docs/evidence/h200x2/README.md). The tests prove that what the
role reported live is what the project's code reads from the raw outputs, and that the by-hand run agrees."""
import json
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.health import nccl_results as nr
from ansible_collections.b300.rollout.plugins.module_utils.health import thermal

EV = pathlib.Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200x2"


def _load(p):
    return json.loads((EV / p).read_text())


def test_nccl_g2_role_verdict_matches_raw_repeats():
    verdict = _load("nccl_g2/role-verdict.json")
    th = verdict["threshold"]
    assert verdict["status"] == "ok" and verdict["gpu_count"] == 2 and verdict["gpu_name"] == "NVIDIA H200"
    repeats = []
    for i in (1, 2, 3):
        meta = _load("nccl_g2/role-raw/single-%d.meta.json" % i)
        out = (EV / ("nccl_g2/role-raw/single-%d.out" % i)).read_text()
        js = (EV / ("nccl_g2/role-raw/single-%d.json" % i)).read_text()
        repeats.append(nr.analyze_repeat(i, meta["rc"], meta["timed_out"], out, js, th))
    assert [r["status"] for r in repeats] == ["ok", "ok", "ok"]
    assert [round(r["gated_gbps"], 3) for r in repeats] == [round(x, 3) for x in verdict["per_repeat_gated_gbps"]]
    v = nr.classify(repeats, th, gpu_count=2)
    assert v["status"] == "ok"
    assert abs(v["gated_gbps"] - verdict["gated_gbps"]) < 0.01
    # the figure is a real NV18 figure: within 10 % of the earlier real capture, far above the 305 GB/s gate
    assert 305.0 < verdict["gated_gbps"] < 380.0


def test_nccl_g2_by_hand_agrees_with_role():
    s = _load("nccl_g2/summary.json")
    hand = nr.analyze_repeat(1, 0, False, (EV / "nccl_g2/byhand.txt").read_text(),
                             (EV / "nccl_g2/byhand.json").read_text(), s["role"] and _load("nccl_g2/role-verdict.json")["threshold"])
    assert hand["status"] == "ok"
    ratio = s["role"]["gated_gbps"] / hand["gated_gbps"]
    assert abs(ratio - s["ratio_role_over_by_hand"]) < 0.001
    assert 0.97 <= ratio <= 1.03
    assert s["same_arguments"] and s["same_env"]
    assert s["role"]["env"]["NCCL_NVLS_ENABLE"] == "0"


def test_nccl_g1_is_correctness_only_on_one_gpu():
    s = _load("nccl_g1/summary.json")
    assert s["gpus"] == 1 and s["metric"] == "algbw" and s["threshold_gbps"] is None
    hand = nr.analyze_repeat(1, 0, False, (EV / "nccl_g1/byhand.txt").read_text(),
                             (EV / "nccl_g1/byhand.json").read_text(), {"metric": "algbw", "min_gbps": None})
    assert hand["status"] == "ok" and hand["max_size_busbw_gbps"] == 0.0
    assert 1500 < hand["gated_gbps"] < 3000
    assert abs(s["role"]["gated_gbps"] / hand["gated_gbps"] - 1) < 0.03


def test_thermal_soak_samples_give_the_reported_verdict():
    summ = _load("thermal/summary.json")
    samples = thermal.parse_samples((EV / "thermal" / "samples.csv").read_text())["samples"]
    assert len(samples) > 100  # 150 s at one sample per 2 s, 2 GPUs
    again = thermal.analyse_host(samples, expected_gpus=[0, 1], duration_s=summ["duration_s"])
    assert again["verdict"] == summ["verdict"] == "ok"
    for idx in ("0", "1"):
        assert again["gpus"][idx]["temp_max_c"] == summ["gpus"][idx]["temp_max_c"]
        assert again["gpus"][idx]["sm_median_mhz"] == summ["gpus"][idx]["sm_median_mhz"]
        # a real bf16 burner on H200 runs power-capped, which is not thermal throttling
        assert summ["gpus"][idx]["reason_counts"].get("sw_power_cap", 0) > 0
        assert summ["gpus"][idx]["temp_max_c"] < 90


# ------------------------------------------------------------ docs/evidence/h200x1 (1x H200, 2026-12-01)
EV1 = EV.parent / "h200x1"


def _load1(p):
    return json.loads((EV1 / p).read_text())


def test_h200x1_facts_parse_of_raw_equals_live():
    from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology
    g = EV1 / "gpu_facts"
    live = _load1("gpu_facts/gpu_topology_facts.json")
    parsed = build_gpu_topology((g / "raw/q.xml").read_text(), (g / "raw/topo.txt").read_text(),
                                (g / "raw/nvlink-s.txt").read_text(), sysfs_root=str(g / "sys"))
    assert json.loads(json.dumps(parsed)) == live
    assert live["gpu_count"] == 1 and live["gpus"][0]["name"] == "NVIDIA H200"
    assert live["driver_version"] == "580.159.04" and live["affinity_disagreements"] == []
    assert _load1("gpu_facts/timing.json")["adhoc_ansible_module_wall_s"]["median"] > 0


def test_h200x1_nccl_g1_role_and_by_hand_read_the_same_table():
    s = _load1("nccl_g1/summary.json")
    hand = nr.analyze_repeat(1, 0, False, (EV1 / "nccl_g1/byhand.txt").read_text(),
                             (EV1 / "nccl_g1/byhand.json").read_text(), {"metric": "algbw", "min_gbps": None})
    assert hand["status"] == "ok" and hand["max_size_busbw_gbps"] == 0.0
    assert hand["rows"] == 30  # 8 B .. 4 GiB by x2: the 30 rows of the raw table, every one read
    assert abs(hand["gated_gbps"] - s["by_hand"]["gated_gbps"]) < 0.01
    assert abs(s["role"]["gated_gbps"] / hand["gated_gbps"] - 1) < 0.03
    assert _load1("nccl_g1/role-verdict.json")["status"] == "ok"


def test_h200x1_dmon_sampler_soak_gives_the_reported_verdict():
    summ = _load1("thermal_dmon/summary.json")
    # its samples.csv is kept once, as the real-world dmon fixture (byte for byte what the sampler wrote)
    raw = EV.parents[2] / "tests/fixtures/real-world/dmon/h200_1gpu_puc_DT_under_load.txt"
    parsed = thermal.parse_any(raw.read_text(), interval_s=2)
    assert parsed["sampler"] == "dmon" and parsed["malformed"] == 0 and len(parsed["samples"]) == 31
    again = thermal.analyse_host(parsed["samples"], {"sample_ms": 2000}, expected_gpus=[0],
                                 duration_s=summ["duration_s"])
    assert again["verdict"] == summ["verdict"] == "ok"
    for key in ("temp_max_c", "sm_median_mhz", "loaded_samples", "power_max_w"):
        assert again["gpus"]["0"][key] == summ["gpus"]["0"][key], key
    assert summ["gpus"]["0"]["temp_max_c"] == 60.0  # the largest gtemp in the raw text
    assert summ["gpus"]["0"]["samples"] < summ["gpus"]["0"]["loaded_samples"] + 5  # idle head/tail only


@pytest.mark.parametrize("run", ["thermal", "thermal_rerun"])  # thermal_rerun: after the one-executable-lookup change
def test_h200x1_query_sampler_soak_gives_the_reported_verdict(run):
    summ = _load1(run + "/summary.json")
    samples = thermal.parse_samples((EV1 / run / "samples.csv").read_text())["samples"]
    again = thermal.analyse_host(samples, expected_gpus=[0], duration_s=summ["duration_s"])
    assert again["verdict"] == summ["verdict"] == "ok"
    assert again["gpus"]["0"]["temp_max_c"] == summ["gpus"]["0"]["temp_max_c"]
    assert summ["gpus"]["0"]["reason_counts"].get("sw_power_cap", 0) > 0


# --- 1x H200, 2026-12-02: the triage's GPU-side parts and the health-history sampler (docs/evidence/h200x1/triage_history)
TH = pathlib.Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200x1" / "triage_history"


def test_h200_history_window_rereads_from_the_samples(tmp_path):
    """The window the real run reported is what read_window computes again from the sampler's own file."""
    from ansible_collections.b300.rollout.plugins.module_utils.health import health_history as hh
    reported = json.loads((TH / "window.json").read_text())
    (tmp_path / "current.jsonl").write_text((TH / "history-current.jsonl").read_text())
    w = reported["window"]
    again = hh.read_window(str(tmp_path), w["end_epoch"] - w["start_epoch"], now=w["end_epoch"], plot_context_s=0)
    assert again["available"] and again["window"]["samples"] == w["samples"] == 93
    keys = ("samples", "max_temp_c", "max_mem_temp_c", "min_sm_clock_mhz", "thermal_violation_s", "power_violation_s",
            "hot")
    assert {k: again["gpus"]["0"][k] for k in keys} == {k: reported["gpus"]["0"][k] for k in keys}
    # the burner held the 700 W cap (power violation), never a thermal one: not hot, as the plot title says
    assert reported["gpus"]["0"]["hot"] is False and reported["gpus"]["0"]["power_violation_s"] > 100


def test_h200_dmon_pucv_text_reads_as_the_sampler_reads_it():
    """The raw `nvidia-smi dmon -s pucv` text of this driver: one GPU, idle 36 C / 40 C HBM, pviol/tviol present."""
    from ansible_collections.b300.rollout.plugins.module_utils.health import health_history as hh
    gpus, _parsed = hh.gpu_round((TH / "dmon_pucv_c1.txt").read_text())
    assert list(gpus) == ["0"], gpus
    assert gpus["0"]["temp"] == 36 and gpus["0"]["mtemp"] == 40 and gpus["0"]["sm"] == 345
    assert gpus["0"]["pviol"] == 0 and gpus["0"]["tviol"] == 0 and gpus["0"]["pwr"] == 77


def test_h200_triage_gpu_reads_match_the_report():
    """The triage judged GPU 0 ok from the real nvidia-smi -q -x: replay counter 0, no clock-event time, persistence."""
    from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_gpu
    gpus = triage_gpu.parse_gpu_extras((TH / "nvidia-smi-q.xml").read_text())
    rep = json.loads((TH / "triage-report.json").read_text())
    host = rep["hosts"]["localhost"]
    assert host["devices"]["GPU 0"]["verdict"] == "ok" and host["status"] == "suspect"
    assert rep["summary"]["exit_code"] == 0
    assert (TH / "triage-changed-files.txt").read_text() == ""
    assert len(gpus) == 1, gpus
