"""Tests for module_utils/health/thermal.py, the soak runner and tools/plot_thermal.py.

The REAL input is the H200 `--query-gpu` capture (sandbox/hwemu/real/*/query.csv, driver 580.159.04).
Every other series here is SYNTHESIZED by `synth_csv()` below (no B300 soak capture exists yet): it writes the same
`--format=csv,noheader,nounits` rows nvidia-smi prints for the role's query fields.
"""
import datetime
import importlib.util
import json
import os
import pathlib
import struct
import sys
import time
import zlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.health import thermal

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIELDS = list(thermal.QUERY_FIELDS)


def synth_csv(n_gpus=2, seconds=300, step=2.0, temp=None, sm=None, util=None, reasons=None, power=None,
              header=False, fields=FIELDS):
    """SYNTHESIZED sampler output. temp/sm/util/power/reasons: callables (gpu, t) -> value."""
    temp = temp or (lambda g, t: 60 + min(t, 120) / 10.0)
    sm = sm or (lambda g, t: 1965)
    util = util or (lambda g, t: 100)
    power = power or (lambda g, t: 1010.5 + g)
    reasons = reasons or (lambda g, t: set())
    start = datetime.datetime(2026, 11, 29, 16, 0, 0)
    lines = [", ".join(fields)] if header else []
    t = 0.0
    while t <= seconds:
        ts = (start + datetime.timedelta(seconds=t)).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        for g in range(n_gpus):
            act = reasons(g, t)
            mask = sum(thermal.REASON_BITS[r] for r in act)
            vals = {"timestamp": ts, "index": str(g), "temperature.gpu": "%d" % temp(g, t),
                    "clocks.current.sm": "%d" % sm(g, t), "clocks.current.memory": "3996",
                    "power.draw": "%.2f" % power(g, t), "utilization.gpu": "%d" % util(g, t),
                    "clocks_event_reasons.active": "0x%016x" % mask}
            vals["clocks_throttle_reasons.active"] = vals["clocks_event_reasons.active"]
            for f in fields:
                if f.startswith(("clocks_event_reasons.", "clocks_throttle_reasons.")) and f not in vals:
                    vals[f] = "Active" if f.split(".", 1)[1] in act else "Not Active"
            lines.append(", ".join(vals[f] for f in fields))
        t += step
    return "\n".join(lines) + "\n"


def judge(text, **params):
    parsed = thermal.parse_samples(text, FIELDS)
    return thermal.analyse_host(parsed["samples"], params, expected_gpus=[0, 1], host="synth", duration_s=300)


# ---------------------------------------------------------------------------------------------- real capture
@pytest.mark.parametrize("machine,gpus", [("nvidia-h200-vm", 1), ("nvidia-h200x2-vm", 2)])
def test_parse_real_query_csv_with_header_and_units(real_fixtures, machine, gpus):
    parsed = thermal.parse_samples((real_fixtures / machine / "query.csv").read_text())
    assert parsed["malformed"] == 0
    assert [s["index"] for s in parsed["samples"]] == list(range(gpus))
    first = parsed["samples"][0]
    # '0, NVIDIA H200, ..., 36, 405 MHz, 1980 MHz, 116.40 W, ...' (1-GPU) / '32, 345 MHz, ..., 76.71 W' (2-GPU)
    assert first["temp_c"] == {"nvidia-h200-vm": 36.0, "nvidia-h200x2-vm": 32.0}[machine]
    assert first["sm_mhz"] == {"nvidia-h200-vm": 405.0, "nvidia-h200x2-vm": 345.0}[machine]
    assert first["power_w"] == {"nvidia-h200-vm": 116.4, "nvidia-h200x2-vm": 76.71}[machine]
    # clocks_event_reasons.active 0x0000000000000001 = GPU idle (the real idle machine)
    assert first["reasons"] == {"gpu_idle"}


def test_real_noheader_capture_parses_with_explicit_fields(real_fixtures):
    text = (real_fixtures / "nvidia-h200x2-vm" / "query-noheader.csv").read_text()
    parsed = thermal.parse_samples(text, ["index", "name", "pci.bus_id", "temperature.gpu"])
    assert [(s["index"], s["temp_c"]) for s in parsed["samples"]] == [(0, 32.0), (1, 31.0)]
    assert parsed["samples"][0]["reasons"] is None  # no reason column -> unknown, not "none active"


def test_real_idle_capture_judged_error_never_loaded(real_fixtures):
    # An idle real GPU (the capture has no utilization column) must never pass a soak as "ok".
    parsed = thermal.parse_samples((real_fixtures / "nvidia-h200-vm" / "query.csv").read_text())
    for s in parsed["samples"]:
        s["t"] = 1000.0
    res = thermal.analyse_host(parsed["samples"], host="h200")
    assert res["verdict"] == "error"
    assert "never loaded" in res["gpus"]["0"]["reasons"][0]


# ---------------------------------------------------------------------------------------------- parsing details
def test_parse_helpers():
    assert thermal.parse_number("405 MHz") == 405.0
    assert thermal.parse_number("[N/A]") is None
    assert thermal.parse_number("[Not Supported]") is None
    assert thermal.parse_active("0x0000000000000060") == {"sw_thermal_slowdown", "hw_thermal_slowdown"}
    assert thermal.parse_active("0x0000000000000004") == {"sw_power_cap"}
    assert thermal.parse_active("junk") is None
    t = thermal.parse_timestamp("2026/11/29 16:43:41.500")
    assert t - thermal.parse_timestamp("2026/11/29 16:43:40.000") == pytest.approx(1.5)
    assert thermal.invalid_field('Field "clocks_event_reasons.active" is not a valid field to query.\n') == \
        "clocks_event_reasons.active"


def test_legacy_field_names():
    legacy = thermal.legacy_fields(FIELDS)
    assert "clocks_throttle_reasons.hw_thermal_slowdown" in legacy and "clocks_event_reasons.active" not in legacy
    text = synth_csv(seconds=10, fields=legacy, reasons=lambda g, t: {"hw_thermal_slowdown"})
    parsed = thermal.parse_samples(text, legacy)
    assert parsed["samples"][0]["reasons"] == {"hw_thermal_slowdown"}


def test_truncated_last_line_is_counted_not_fatal():
    text = synth_csv(seconds=10) + "2026/11/29 16:00:12.000, 0, 7"  # killed mid-line at the deadline
    parsed = thermal.parse_samples(text, FIELDS)
    assert parsed["malformed"] == 1
    assert len(parsed["samples"]) == 12


# ---------------------------------------------------------------------------------------------- verdicts (synthesized)
def test_verdict_ok_synth():
    res = judge(synth_csv())
    assert res["verdict"] == "ok", res["reasons"]
    g = res["gpus"]["0"]
    assert g["temp_max_c"] == 72.0
    assert g["sm_min_mhz"] == 1965.0 and g["sm_median_mhz"] == 1965.0
    assert g["time_above_ceiling_s"] == 0.0 and g["first_throttled_s"] is None
    assert g["loaded_samples"] == g["samples"] == 151


def test_verdict_ok_despite_power_cap_by_default_but_configurable():
    text = synth_csv(reasons=lambda g, t: {"sw_power_cap"})
    assert judge(text)["verdict"] == "ok"
    res = judge(text, throttle_reasons=["sw_power_cap"])
    assert res["verdict"] == "throttled"
    assert res["gpus"]["1"]["reason_counts"]["sw_power_cap"] == 151


def test_verdict_hot_synth_seed_like():
    # seed 6.1: 96 C after ~15 min at full load. Here GPU 1 crosses 90 C at t=200 s.
    text = synth_csv(temp=lambda g, t: 96 if (g == 1 and t >= 200) else 75)
    res = judge(text)
    assert res["verdict"] == "hot"
    g1 = res["gpus"]["1"]
    assert g1["verdict"] == "hot" and res["gpus"]["0"]["verdict"] == "ok"
    assert g1["temp_max_c"] == 96.0
    assert g1["first_above_ceiling_s"] == 200.0
    assert g1["time_above_ceiling_s"] == pytest.approx(102.0, abs=2.1)  # samples 200..300 s, 2 s each
    assert "GPU 1 hot" in res["reasons"][0]


def test_ceiling_is_configurable():
    text = synth_csv(temp=lambda g, t: 86)
    assert judge(text)["verdict"] == "ok"
    assert judge(text, ceiling_c=85)["verdict"] == "hot"


def test_verdict_throttled_by_reasons_synth():
    therm = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
    text = synth_csv(reasons=lambda g, t: therm if (g == 0 and t >= 150) else set(), temp=lambda g, t: 88)
    res = judge(text)
    assert res["verdict"] == "throttled"
    g0 = res["gpus"]["0"]
    assert g0["first_throttled_s"] == 150.0
    assert g0["throttle_fraction"] == pytest.approx(76 / 151, abs=0.01)
    assert g0["throttled_intervals"] == [[150.0, 302.0]]
    assert res["first_throttled_s"] == 150.0


def test_short_throttle_blip_under_fraction_is_ok():
    text = synth_csv(reasons=lambda g, t: {"hw_slowdown"} if 100 <= t < 110 else set())
    res = judge(text)
    assert res["verdict"] == "ok"
    assert res["gpus"]["0"]["throttle_fraction"] == pytest.approx(5 / 151, abs=0.005)
    assert res["gpus"]["0"]["throttled_intervals"] == [[100.0, 110.0]]
    assert judge(text, throttle_max_fraction=0.01)["verdict"] == "throttled"


def test_verdict_throttled_by_sustained_clock_drop_synth():
    # no reason bit set (e.g. a board that only lowers clocks): 1965 MHz first, 1380 MHz in the last half
    text = synth_csv(sm=lambda g, t: 1380 if t >= 150 else 1965)
    res = judge(text)
    assert res["verdict"] == "throttled"
    g = res["gpus"]["0"]
    assert g["sm_baseline_mhz"] == 1965.0 and g["sm_tail_mhz"] == 1380.0
    assert g["sm_tail_ratio"] == pytest.approx(0.702, abs=0.001)
    assert g["first_throttled_s"] == 150.0
    assert "SM clock fell" in g["reasons"][0]


def test_clock_drop_needs_load_and_a_real_drop():
    # a 10% sag stays ok with the default 15% limit
    assert judge(synth_csv(sm=lambda g, t: 1770 if t >= 150 else 1965))["verdict"] == "ok"
    # clocks drop because the load stopped, not because of heat: utilisation low in the last third -> not throttled
    res = judge(synth_csv(sm=lambda g, t: 600 if t >= 200 else 1965, util=lambda g, t: 0 if t >= 200 else 100))
    assert res["verdict"] == "ok"


def test_verdict_error_no_samples_and_missing_gpu_and_load_failure():
    res = thermal.analyse_host([], host="x", expected_gpus=[0, 1])
    assert res["verdict"] == "error"
    assert "no samples from nvidia-smi" in res["reasons"]
    text = synth_csv(n_gpus=1)
    res = judge(text)  # GPU 1 expected but absent
    assert res["verdict"] == "error" and res["gpus"]["1"]["reasons"] == ["no samples"]
    status = {"duration_s": 300, "loads": [{"name": "gpu0", "argv": ["/usr/bin/python3"], "failed": True,
                                            "ended_early_s": 3.1, "rcs": [1], "log_tail": "RuntimeError: CUDA OOM\n"}],
              "sampler": {"rc": None}, "still_running": []}
    problems = thermal.load_problems(status)
    assert problems and "CUDA OOM" in problems[0] and "rc 1" in problems[0]
    res = thermal.analyse_host(thermal.parse_samples(synth_csv(), FIELDS)["samples"], load_errors=problems)
    assert res["verdict"] == "error"
    assert thermal.load_problems(None) == ["runner status missing (the soak did not run or was killed)"]


def test_verdict_error_when_never_loaded_synth():
    res = judge(synth_csv(util=lambda g, t: 0, sm=lambda g, t: 345))
    assert res["verdict"] == "error"
    assert "never loaded" in res["gpus"]["0"]["reasons"][0]


def test_hot_outranks_throttled_and_fleet_summary():
    hot_thr = judge(synth_csv(temp=lambda g, t: 96, reasons=lambda g, t: {"hw_thermal_slowdown"}))
    assert hot_thr["verdict"] == "hot"
    assert len(hot_thr["gpus"]["0"]["reasons"]) == 2
    ok = judge(synth_csv())
    ok["host"], hot_thr["host"] = "b300a", "b300b"
    fleet = thermal.fleet_summary([ok, hot_thr])
    assert fleet["verdict"] == "hot" and fleet["failed_hosts"] == ["b300b"]
    json.dumps(fleet)  # must be JSON-serialisable as written to summary.json


def test_choose_loader_order_and_forcing():
    assert thermal.choose_loader("auto", "/venv/bin/python3", "/x/all_reduce_perf", None) == ("torch", None)
    assert thermal.choose_loader("auto", None, "/x/all_reduce_perf", "/b/gpu_burn") == ("nccl", None)
    assert thermal.choose_loader("auto", None, None, "/b/gpu_burn") == ("burn", None)
    kind, why = thermal.choose_loader("auto", None, None, None)
    assert kind is None and "no loader" in why
    kind, why = thermal.choose_loader("torch", None, "/x/all_reduce_perf", None)
    assert kind is None and "torch" in why


def test_build_plan_torch_one_process_per_gpu_nvls_off():
    plan = thermal.build_plan("torch", 600, 2000, "/usr/bin/nvidia-smi", FIELDS, [0, 1, 2], "/w/run",
                              "/venv/bin/python3", burner_script="/w/torch_burn.py")
    assert [ld["env"]["CUDA_VISIBLE_DEVICES"] for ld in plan["loads"]] == ["0", "1", "2"]
    assert all(ld["env"]["NCCL_NVLS_ENABLE"] == "0" for ld in plan["loads"])
    assert plan["sampler"]["argv"][-2:] == ["-lms", "2000"]
    assert "--format=csv,noheader,nounits" in plan["sampler"]["argv"]
    assert plan["sampler"]["header"].split(",") == FIELDS
    # the burner outlives the deadline, so the GPU is still loaded when sampling stops
    assert int(plan["loads"][0]["argv"][plan["loads"][0]["argv"].index("--seconds") + 1]) > 600
    nccl = thermal.build_plan("nccl", 600, 2000, "smi", FIELDS, [0, 1], "/w", "/opt/nccl-tests/2.19.6/build/all_reduce_perf")
    assert nccl["loads"][0]["loop"] is True and nccl["loads"][0]["argv"][-2:] == ["-g", "2"]


# ---------------------------------------------------------------------------------------------- runner
def _load_runner():
    path = ROOT / "roles" / "thermal_soak" / "files" / "thermal_soak_runner.py"
    spec = importlib.util.spec_from_file_location("thermal_soak_runner", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open("/proc/%d/stat" % pid) as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_runner_stops_everything_at_the_deadline(tmp_path):
    runner = _load_runner()
    sampler = [sys.executable, "-c",
               "import time,sys\nwhile True:\n print(time.strftime('%Y/%m/%d %H:%M:%S.000')+', 0, 50', flush=True)\n"
               " time.sleep(0.2)"]
    # a loader that ignores SIGTERM and forks a child that also ignores it: needs SIGKILL of the whole session
    stubborn = [sys.executable, "-c",
                "import os,signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nos.fork()\ntime.sleep(60)"]
    plan = {"duration_s": 4, "grace_s": 1, "out_dir": str(tmp_path / "run"),
            "sampler": {"argv": sampler, "header": "timestamp,index,temperature.gpu"},
            "loads": [{"name": "stubborn", "argv": stubborn, "env": {}, "loop": False},
                      {"name": "looped", "argv": ["true"], "env": {}, "loop": True}]}
    t = time.time()
    status = runner.run(plan)
    assert time.time() - t < 10
    assert status["still_running"] == []
    pids = json.loads((tmp_path / "run" / "pids.json").read_text())["sessions"]
    assert not any(_alive(p) for p in pids)
    looped = [ld for ld in status["loads"] if ld["name"] == "looped"][0]
    assert looped["runs"] > 1 and not looped["failed"]
    assert not [ld for ld in status["loads"] if ld["name"] == "stubborn"][0]["failed"]
    parsed = thermal.parse_samples((tmp_path / "run" / "samples.csv").read_text())
    assert len(parsed["samples"]) >= 5 and parsed["samples"][0]["temp_c"] == 50.0


def test_runner_reports_a_loader_that_dies_early(tmp_path):
    runner = _load_runner()
    plan = {"duration_s": 3, "grace_s": 1, "out_dir": str(tmp_path / "run"),
            "sampler": {"argv": ["sleep", "30"], "header": "timestamp,index"},
            "loads": [{"name": "gpu0", "argv": [sys.executable, "-c", "import sys; sys.exit('CUDA error: no device')"],
                       "env": {}, "loop": False}]}
    status = runner.run(plan)
    problems = thermal.load_problems(status)
    assert status["loads"][0]["failed"] and status["loads"][0]["rcs"] == [1]
    assert "CUDA error: no device" in problems[0]


# ---------------------------------------------------------------------------------------------- plot
def _png_size(path):
    data = pathlib.Path(path).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert zlib.crc32(data[12:29]) == struct.unpack(">I", data[29:33])[0]
    return w, h


def test_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    spec = importlib.util.spec_from_file_location("plot_thermal", ROOT / "tools" / "plot_thermal.py")
    plot_thermal = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot_thermal)
    therm = {"hw_thermal_slowdown", "sw_thermal_slowdown"}
    text = synth_csv(n_gpus=4, seconds=600,
                     temp=lambda g, t: min(60 + t / 8.0 + 2 * g, 96 if g == 3 else 84),
                     sm=lambda g, t: 1300 if (g == 3 and t >= 300) else 1965 - 5 * g,
                     reasons=lambda g, t: therm if (g == 3 and t >= 300) else set(), header=True)
    samples_csv = tmp_path / "samples.csv"
    samples_csv.write_text(text)
    parsed = thermal.parse_samples(text)
    summary = thermal.analyse_host(parsed["samples"], host="b300b (SYNTHESIZED)", duration_s=600)
    assert summary["verdict"] == "hot"
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    out = tmp_path / "plot.png"
    rc = plot_thermal.main(["--samples", str(samples_csv), "--summary", str(tmp_path / "summary.json"),
                            "--out", str(out)])
    assert rc == 0
    w, h = _png_size(out)
    assert (w, h) == (1320, 770)
    assert out.stat().st_size > 20000
    keep = os.environ.get("THERMAL_PLOT_KEEP")
    if keep:
        pathlib.Path(keep).write_bytes(out.read_bytes())


def test_soak_searches_the_preinstalled_nccl_tests_dir_of_the_home(repo_root):
    """thermal_soak_nccl_bin_dirs reads the home's nccl_validation_tests_bin_dir (it once read nccl_tests_bin_dir,
    which nothing defines, so a preinstalled all_reduce_perf never became the soak's loader)."""
    import jinja2.nativetypes
    import yaml
    soak = yaml.safe_load((repo_root / "roles" / "thermal_soak" / "defaults" / "main.yml").read_text())
    home = yaml.safe_load((repo_root / "roles" / "b300_defaults" / "defaults" / "main.yml").read_text())
    expr = jinja2.nativetypes.NativeEnvironment(undefined=jinja2.StrictUndefined).from_string(
        soak["thermal_soak_nccl_bin_dirs"])
    assert expr.render(home) == ["/opt/nccl-tests/*/build"]
    assert expr.render(dict(home, nccl_validation_tests_bin_dir="/opt/site/nccl")) == [
        "/opt/site/nccl", "/opt/nccl-tests/*/build"]
