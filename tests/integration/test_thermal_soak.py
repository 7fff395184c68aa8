"""Integration: playbooks/thermal_soak.yml on the two sandbox hosts (emulated hardware, SYNTHESIZED values).

b300a stays `healthy`, b300b is switched to `thermal_throttle` (95-96 C, hw/sw thermal slowdown active, rising to
~99 C under the hwemu `gpu_burn` stand-in). A ~20 s soak with the gpu_burn loader must judge b300a ok and b300b hot
or throttled, write samples.csv/status.json/summary.json/plot.png per host plus the all-hosts summary.json, fail the
play only after writing them, and leave no loader/sampler process behind. A finalizer puts both hosts back to
`healthy` (which also clears the emulator's load state).

Needs the hwemu nvidia-smi to know the `timestamp` query field (real drivers do); the fixture checks it first.
"""
import json
import re

import pytest

HOSTS = ("b300a", "b300b")
DURATION_S = 20


@pytest.fixture(scope="module")
def fleet(sandbox, request):
    probe = sandbox.exec("b300a", "/opt/hwemu/bin/nvidia-smi --query-gpu=timestamp,index --format=csv,noheader",
                         check=False)
    assert probe.returncode == 0, ("hwemu nvidia-smi must support the 'timestamp' query field (real drivers do): "
                                   + probe.stdout + probe.stderr)
    sandbox.scenarios_back_to_healthy(request, HOSTS)
    sandbox.scenario("b300a", "healthy")
    sandbox.scenario("b300b", "thermal_throttle")
    return sandbox


@pytest.fixture(scope="module")
def soak(fleet, tmp_path_factory):
    art = tmp_path_factory.mktemp("thermal")
    argv = ["ansible-playbook", "playbooks/thermal_soak.yml", "-i", "inventory/sandbox", "-l", "b300a,b300b",
            "-e", "thermal_soak_duration_s=%d" % DURATION_S, "-e", "thermal_soak_sample_ms=1000",
            "-e", "thermal_soak_loader=burn", "-e", "thermal_soak_poll_s=2", "-e", "thermal_soak_artifacts_dir=%s" % art]
    r = fleet.run(argv, check=False, timeout=300)
    return {"rc": r.returncode, "out": r.stdout + r.stderr, "art": art, "sandbox": fleet}


def test_verdicts_ok_and_throttled(soak):
    out = soak["out"]
    fleet = json.loads((soak["art"] / "summary.json").read_text())
    assert fleet["hosts"]["b300a"]["verdict"] == "ok", fleet["hosts"]["b300a"]["reasons"]
    assert fleet["hosts"]["b300b"]["verdict"] in ("hot", "throttled"), fleet["hosts"]["b300b"]["reasons"]
    assert fleet["failed_hosts"] == ["b300b"]
    assert fleet["verdict"] == fleet["hosts"]["b300b"]["verdict"]
    b = fleet["hosts"]["b300b"]
    assert b["temp_max_c"] > 90 and b["first_throttled_s"] is not None
    assert all(g["throttle_fraction"] > 0.5 for g in b["gpus"].values())
    a = fleet["hosts"]["b300a"]
    assert a["gpu_count"] == 8 and a["temp_max_c"] < 90 and a["first_throttled_s"] is None
    assert all(g["loaded_samples"] >= DURATION_S // 2 for g in a["gpus"].values())
    # the play fails because of b300b, after every report was written
    assert soak["rc"] != 0, out[-3000:]
    assert re.search(r"thermal soak on b300b: (HOT|THROTTLED)", out), out[-3000:]
    recap = dict(re.findall(r"^(b300[ab])\s+:\s+(.*)$", out, re.M))
    assert "failed=0" in recap["b300a"] and "failed=1" in recap["b300b"], recap


def test_artifacts_per_host(soak):
    for h in HOSTS:
        d = soak["art"] / h
        summary = json.loads((d / "summary.json").read_text())
        assert summary["host"] == h
        lines = (d / "samples.csv").read_text().splitlines()
        assert lines[0].startswith("timestamp,index,temperature.gpu,clocks.current.sm")
        assert len(lines) - 1 >= 8 * (DURATION_S - 4)  # 8 GPUs x ~1 sample/s
        assert summary["samples"] == len(lines) - 1 - summary["malformed_lines"]
        status = json.loads((d / "status.json").read_text())
        assert status["loads"][0]["argv"][0] == "/opt/hwemu/bin/gpu_burn"
        assert not status["loads"][0]["failed"] and status["still_running"] == []
        png = (d / "plot.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000


def test_nothing_left_running(soak):
    for h in HOSTS:
        r = soak["sandbox"].exec(
            h, "ps -eo pid,args | grep -E 'gpu_burn|nvidia-smi .*-lms|thermal_soak_runner' | grep -v grep", check=False)
        assert r.stdout.strip() == "", (h, r.stdout)
