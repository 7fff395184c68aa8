"""Health history (issue 21 part 2): module_utils/health/health_history.py, the sampler (roles/health_history/files/sampler.py),
the read module and the history plot.

REAL input: the H200 `nvidia-smi dmon` captures (sandbox/hwemu/real/*/dmon-s.txt, tests/fixtures/real-world/dmon/);
their expected values below are read off the raw text. Histories over hours are SYNTHESIZED by `build_history()` (a
B300 history capture does not exist): records written through the same writer the sampler uses, with a fake clock.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.health import health_history as hh
from ansible_collections.b300.rollout.plugins.module_utils.health import thermal

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLER = ROOT / "roles" / "health_history" / "files" / "sampler.py"
REAL = ROOT / "sandbox" / "hwemu" / "real"
REAL_WORLD_DMON = ROOT / "tests" / "fixtures" / "real-world" / "dmon"


# ---------------------------------------------------------------------------------------------- durations
@pytest.mark.parametrize("text,secs", [("6h", 21600), ("90m", 5400), ("1h30m", 5400), ("45", 45), ("45s", 45),
                                       ("2d", 172800), (" 1.5h ", 5400), ("1w", 604800)])
def test_parse_duration(text, secs):
    assert hh.parse_duration(text) == secs


@pytest.mark.parametrize("bad", ["", "h", "6x", "-5m", "0", "6h garbage", "m6"])
def test_parse_duration_refuses(bad):
    with pytest.raises(ValueError):
        hh.parse_duration(bad)


# ---------------------------------------------------------------------------------------------- dmon rounds
def _feed_all(text, clock=None):
    r = hh.DmonRounds(clock=clock or (lambda: 0.0))
    rounds = [x for line in text.splitlines() for x in r.feed(line)]
    last = r.flush()
    return rounds + ([last] if last else []), r


def test_rounds_from_the_real_2xh200_dmon_capture():
    text = (REAL / "nvidia-h200x2-vm" / "dmon-s.txt").read_text()
    rounds, r = _feed_all(text)
    assert len(rounds) == 3 and r.malformed == 0
    # first row of the capture: "0  76  31  32  0 ... 3201  345  0  0 ..."
    assert rounds[0][1]["0"] == {"pwr": 76, "temp": 31, "mtemp": 32, "util": 0, "mclk": 3201, "sm": 345,
                                 "pviol": 0, "tviol": 0}
    assert rounds[0][1]["1"]["pwr"] == 77
    assert [sorted(rd) for _t, rd in rounds] == [["0", "1"]] * 3


def test_rounds_are_parsed_by_the_thermal_soak_parser():
    """One dmon parser: every round value equals what thermal.parse_dmon returns for the same line."""
    text = (REAL / "nvidia-h200x2-vm" / "dmon-s.txt").read_text()
    rounds, _r = _feed_all(text)
    parsed = thermal.parse_dmon(text)["samples"]
    flat = [rec for _t, rd in rounds for _i, rec in sorted(rd.items())]
    assert flat == [hh.gpu_record(s) for s in parsed]


def test_rounds_real_capture_with_dashes_and_a_cut_last_line():
    text = (REAL_WORLD_DMON / "1gpu_pucvmet_DT_ctrl_c.txt").read_text()
    rounds, r = _feed_all(text)
    # 3 complete rows (38 C, 6 W, pclk 180, mclk 405, mtemp "-"), the 4th has "^C" inside: malformed
    assert len(rounds) == 3 and r.malformed == 1
    assert rounds[0][1]["0"] == {"pwr": 6, "temp": 38, "util": 0, "mclk": 405, "sm": 180, "pviol": 0, "tviol": 0}
    assert "mtemp" not in rounds[0][1]["0"]


def test_rounds_under_load_real_h200():
    text = (REAL_WORLD_DMON / "h200_1gpu_puc_DT_under_load.txt").read_text()
    rounds, _r = _feed_all(text)
    first = rounds[0][1]["0"]
    assert first == {"pwr": 79, "temp": 33, "mtemp": 37, "util": 0, "mclk": 3201, "sm": 345}  # 20:27:21 row
    assert max(rd["0"]["pwr"] for _t, rd in rounds) == 694       # the 20:27:29 row
    assert "tviol" not in first                                    # -s puc: no violation columns


def test_round_closes_as_soon_as_all_known_gpus_are_in():
    clock = iter(range(100, 200)).__next__
    r = hh.DmonRounds(clock=lambda: float(clock()))
    header = "# gpu    pwr  gtemp\n# Idx      W      C\n"
    done = [d for x in (header + "0 10 30\n1 11 31\n0 12 32\n1 13 33\n").splitlines() for d in r.feed(x)]
    # round 1 closes when GPU 0 repeats; round 2 as soon as its 2nd GPU arrives (count now known)
    assert [sorted(d[1]) for d in done] == [["0", "1"], ["0", "1"]]
    assert done[1][1]["1"] == {"pwr": 13, "temp": 33}
    assert r.flush() is None


def test_known_gpu_count_closes_the_first_round_at_once():
    """The service knows the GPU count from its preflight: the first sample is written without waiting an interval."""
    r = hh.DmonRounds(clock=lambda: 5.0, expected=2)
    done = [d for x in "# gpu pwr gtemp\n0 10 30\n1 11 31\n".splitlines() for d in r.feed(x)]
    assert done == [(5.0, {"0": {"pwr": 10, "temp": 30}, "1": {"pwr": 11, "temp": 31}})]


def test_gpu_round_keeps_the_last_sample_of_each_gpu():
    rnd, parsed = hh.gpu_round((REAL / "nvidia-h200x2-vm" / "dmon-s.txt").read_text())
    assert sorted(rnd) == ["0", "1"] and parsed["malformed"] == 0
    assert rnd["1"]["mtemp"] == 32


# ---------------------------------------------------------------------------------------------- NIC counters
def _sysfs(tmp_path, nics):
    """A sysfs-like tree: nics = {dev: {port: {"counters": {...}, "hw_counters": {...}}}}."""
    root = tmp_path / "sys"
    for dev, ports in nics.items():
        for port, subs in ports.items():
            for sub, vals in subs.items():
                d = root / "class" / "infiniband" / dev / "ports" / str(port) / sub
                d.mkdir(parents=True, exist_ok=True)
                for name, v in vals.items():
                    (d / name).write_text("%s\n" % v)
    return root


def test_read_nic_counters(tmp_path):
    root = _sysfs(tmp_path, {
        "mlx5_0": {1: {"counters": {"link_downed": 2, "symbol_error": 0, "port_xmit_data": 123456789012},
                       "hw_counters": {"local_ack_timeout_err": 7, "lifespan": 12, "symbol_error": 4}}},
        "mlx5_1": {1: {"counters": {"link_downed": 0, "garbage": "not-a-number"}}, 2: {"counters": {"link_downed": 1}}},
    })
    (root / "class" / "infiniband" / "mlx5_9" / "ports" / "1").mkdir(parents=True)   # a port without counters
    vals, problems, hw = hh.read_nic_counters(str(root), ["mlx5_0", "mlx5_1", "mlx5_9", "mlx5_404"])
    assert vals["mlx5_0"] == {"link_downed": 2, "symbol_error": 0, "port_xmit_data": 123456789012,
                              "local_ack_timeout_err": 7, "lifespan": 12, "hw_counters/symbol_error": 4}
    assert vals["mlx5_1"] == {"link_downed": 0} and vals["mlx5_1:2"] == {"link_downed": 1}
    assert hw == {"local_ack_timeout_err", "lifespan", "hw_counters/symbol_error"}
    assert len(problems) == 2
    assert problems[0].startswith("mlx5_9 port 1: no readable counters")
    assert problems[1].startswith("mlx5_404: no ports directory")
    assert hh.ib_devices(str(root)) == ["mlx5_0", "mlx5_1", "mlx5_9"]
    assert hh.ib_devices(str(tmp_path / "nowhere")) == []


def test_counter_changes():
    prev = {"a": {"x": 1, "y": 2}}
    assert hh.counter_changes(prev, {"a": {"x": 1, "y": 3}, "b": {"z": 0}}) == {"a": {"y": 3}, "b": {"z": 0}}
    assert hh.counter_changes(prev, prev) == {}


# ---------------------------------------------------------------------------------------------- writing and rotation
NIC_NAMES = ["link_downed", "symbol_error", "port_rcv_errors", "port_xmit_data", "port_rcv_data",
             "local_ack_timeout_err", "packet_seq_err", "out_of_sequence"]


def build_history(d, start, n, iv, gpu_fn, nic_fn, max_file_bytes=64 * 1024, max_files=50):
    """SYNTHESIZED history: n samples every iv seconds from start through the sampler's writer."""
    w = hh.HistoryWriter(str(d), max_file_bytes, max_files, clock=lambda: start)
    r = hh.Recorder(w, iv)
    r.meta(start - 1, {"host": "synth", "interval_s": iv})
    for k in range(n):
        t = start + k * iv
        r.sample(t, gpu_fn(k, t), nic_fn(k, t))
    return w


def _quiet_gpus(k, t):
    return {"0": {"temp": 70, "mtemp": 72, "sm": 1900, "pwr": 800, "pviol": 0, "tviol": 0}}


def _nics_k(k, t):
    return {"mlx5_0": {c: (k if c == "port_xmit_data" else 0) for c in NIC_NAMES}}


def _records(path):
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines()]


def test_rotation_bounds_size_and_count(tmp_path):
    cap, count = 4096, 3
    build_history(tmp_path, 1_800_000_000, 300, 10, _quiet_gpus, _nics_k, max_file_bytes=cap, max_files=count)
    files = hh.history_files(str(tmp_path))
    assert len(files) == count and files[-1].endswith(hh.CURRENT)
    assert all(os.path.getsize(f) <= cap for f in files), [os.path.getsize(f) for f in files]
    total, n = hh.disk_usage(str(tmp_path))
    assert n == count and total <= count * cap
    # rotated names sort by their first record's time, and every file starts with a full counter snapshot
    firsts = []
    for f in files:
        recs = [r for r in _records(f) if "g" in r]
        assert recs[0]["full"] is True and all(not r["full"] for r in recs[1:]), f
        firsts.append(recs[0]["t"])
    assert firsts == sorted(firsts)
    assert [int(os.path.basename(f).split("-")[1].split(".")[0]) for f in files[:-1]] == [int(x) for x in firsts[:-1]]
    # the newest records survived: the last one is sample 299
    assert _records(files[-1])[-1]["t"] == 1_800_000_000 + 299 * 10


def test_sparse_records_hold_only_changes(tmp_path):
    build_history(tmp_path, 1_800_000_000, 3, 10, _quiet_gpus, _nics_k)
    recs = [r for r in _records(tmp_path / hh.CURRENT) if "g" in r]
    assert recs[0]["n"]["mlx5_0"] == {c: 0 for c in NIC_NAMES}
    assert recs[1]["n"] == {"mlx5_0": {"port_xmit_data": 1}} and recs[2]["n"] == {"mlx5_0": {"port_xmit_data": 2}}


def test_writer_refuses_caps_that_bound_nothing(tmp_path):
    with pytest.raises(hh.HistoryError):
        hh.HistoryWriter(str(tmp_path), 4096, 1)
    with pytest.raises(hh.HistoryError):
        hh.HistoryWriter(str(tmp_path), 100, 4)


# ---------------------------------------------------------------------------------------------- reading a window
START = (int(time.time()) // 10) * 10 - 3 * 86400   # three days ago (the module reads up to its own now)
IV = 10
N = 720                                  # two hours of samples, t = START + 10 k
NOW = START + (N - 1) * IV + 5           # 5 s after the last sample
SINCE = 1800                             # window = [START + 5395, NOW]: samples k = 540 .. 719


def _gpus(k, t):
    g0 = {"temp": 85, "mtemp": 80, "sm": 1950, "pwr": 900, "pviol": 0, "tviol": 0}
    if 100 <= k < 110:                   # hot, but before the window
        g0.update(temp=97, tviol=1)
    if 560 <= k < 570:                   # power capped half of each sample, in the window
        g0.update(pviol=50)
    g1 = {"temp": 80, "mtemp": 78, "sm": 1900, "pwr": 880, "pviol": 0, "tviol": 0}
    if 600 <= k < 630:                   # 96 C with thermal violation, in the window (the seed's cliff)
        g1.update(temp=96, mtemp=91, sm=1300, tviol=1)
    if k == 650:                         # 91 C for one sample, no violation
        g1.update(temp=91)
    return {"0": g0, "1": g1}


def _nics(k, t):
    ack = (min(k, 200) - 100 if k >= 100 else 0) + (3 * (min(k, 660) - 650) if k >= 650 else 0)
    link_downed = 5 if k < 680 else (0 if k < 690 else 1)       # reset at k = 680 (driver reload), then one down
    return {"mlx5_0": {"link_downed": link_downed, "symbol_error": 0, "port_xmit_data": 1000 * k},
            "mlx5_3": {"local_ack_timeout_err": ack, "packet_seq_err": 0, "link_downed": 0}}


@pytest.fixture(scope="module")
def two_hours(tmp_path_factory):
    d = tmp_path_factory.mktemp("history")
    build_history(d, START, N, IV, _gpus, _nics, max_file_bytes=16 * 1024, max_files=100)
    return d


def test_history_spans_several_rotated_files(two_hours):
    files = hh.history_files(str(two_hours))
    assert len(files) >= 5
    # the window starts inside a rotated file, not at a file boundary
    firsts = [hh._first_epoch(f) for f in files]
    assert not any(abs(f - (NOW - SINCE)) < IV for f in firsts)


def test_window_reads_across_rotated_files(two_hours):
    res = hh.read_window(str(two_hours), SINCE, now=NOW)
    assert res["available"] is True and res["reason"] is None
    w = res["window"]
    assert (w["start_epoch"], w["end_epoch"]) == (NOW - SINCE, NOW)
    assert w["samples"] == N - 540
    assert (w["first_sample_epoch"], w["last_sample_epoch"]) == (START + 540 * IV, START + 719 * IV)
    # only the files that can hold the window (and the plot context before it) were opened
    assert len(res["files_read"]) < len(hh.history_files(str(two_hours)))
    assert res["skipped_lines"] == 0


def test_window_counter_deltas(two_hours):
    nics = hh.read_window(str(two_hours), SINCE, now=NOW)["nics"]
    # +1 per sample at k 100..199 is before the window; +3 per sample at k 651..660 is inside: 30
    assert nics["mlx5_3"] == {"link_downed": 0, "local_ack_timeout_err": 30, "packet_seq_err": 0}
    # 5 -> 0 is a reset (counts 0), then 0 -> 1: one link down inside the window
    assert nics["mlx5_0"]["link_downed"] == 1
    assert nics["mlx5_0"]["port_xmit_data"] == 1000 * (719 - 539)
    assert nics["mlx5_0"]["symbol_error"] == 0


def test_window_gpu_judgement(two_hours):
    gpus = hh.read_window(str(two_hours), SINCE, now=NOW)["gpus"]
    g0, g1 = gpus["0"], gpus["1"]
    assert g0["samples"] == g1["samples"] == 180
    # GPU 0: its 97 C episode (k 100..109) is outside the window
    assert g0["hot"] is False and g0["first_hot_epoch"] is None and g0["hot_reasons"] == []
    assert g0["max_temp_c"] == 85 and g0["thermal_violation_s"] == 0
    assert g0["power_violation_s"] == 10 * IV * 0.5
    # GPU 1: 30 samples at 96 C with a thermal violation from k = 600
    assert g1["hot"] is True and g1["first_hot_epoch"] == START + 600 * IV
    assert g1["max_temp_c"] == 96 and g1["max_mem_temp_c"] == 91 and g1["min_sm_clock_mhz"] == 1300
    assert g1["thermal_violation_s"] == 30 * IV and g1["power_violation_s"] == 0
    assert g1["hot_reasons"] == ["max temperature 96 C above 90 C", "thermal violation for 300.0 s (dmon tviol)"]


def test_hot_threshold_is_strict_and_configurable(tmp_path):
    def gpus(k, t):
        return {"0": {"temp": 90 + (k == 3), "tviol": 0}, "1": {"temp": 70, "tviol": int(k == 5)},
                "2": {"temp": 90, "tviol": 0}}
    build_history(tmp_path, START, 10, IV, gpus, lambda k, t: {})
    res = hh.read_window(str(tmp_path), 3600, now=START + 100)
    g = res["gpus"]
    assert g["0"]["hot"] and g["0"]["first_hot_epoch"] == START + 30 and g["0"]["max_temp_c"] == 91
    assert g["1"]["hot"] and g["1"]["first_hot_epoch"] == START + 50 and g["1"]["max_temp_c"] == 70
    assert g["1"]["hot_reasons"] == ["thermal violation for 10.0 s (dmon tviol)"]
    assert g["2"]["hot"] is False                               # exactly 90 C is not above 90 C
    assert res["nics"] == {}
    g = hh.read_window(str(tmp_path), 3600, now=START + 100, hot_temp_c=95)["gpus"]
    assert g["0"]["hot"] is False and g["1"]["hot"] is True


def test_window_without_history(tmp_path):
    res = hh.read_window(str(tmp_path / "absent"), 3600, now=NOW)
    assert res["available"] is False and "no history directory" in res["reason"]
    build_history(tmp_path / "old", START, 5, IV, _quiet_gpus, _nics_k)
    res = hh.read_window(str(tmp_path / "old"), 600, now=START + 86400)
    assert res["available"] is False and res["reason"].startswith("no sample between")
    assert res["gpus"] == {} and res["window"]["samples"] == 0


def test_a_line_cut_while_written_is_skipped(tmp_path):
    build_history(tmp_path, START, 5, IV, _quiet_gpus, _nics_k)
    with open(tmp_path / hh.CURRENT, "a") as f:
        f.write('{"v":1,"t":%d,"g":{"0":{"te' % (START + 50))
    res = hh.read_window(str(tmp_path), 3600, now=START + 60)
    assert res["skipped_lines"] == 1 and res["window"]["samples"] == 5


def test_events_in_the_window(tmp_path):
    w = hh.HistoryWriter(str(tmp_path), 65536, 4)
    r = hh.Recorder(w, IV)
    r.event(START, "nvidia-smi dmon exited rc 1: Failed to initialize NVML; restart in 5 s")
    r.sample(START + 10, None, {"mlx5_0": {"link_downed": 0}})   # NIC-only sample while dmon is down
    res = hh.read_window(str(tmp_path), 3600, now=START + 20)
    assert res["events"] == [{"epoch": START, "event": "nvidia-smi dmon exited rc 1: Failed to initialize NVML; "
                                                       "restart in 5 s"}]
    assert res["available"] is False and res["nics"] == {"mlx5_0": {"link_downed": 0}}


def test_plot_data(two_hours):
    res = hh.read_window(str(two_hours), SINCE, now=NOW, plot_points=50, plot_context_s=600)
    pd = res["plot_data"]
    assert pd["t0"] == NOW - SINCE - 600 and pd["window"] == [600, 600 + SINCE]
    g1 = pd["gpus"]["1"]
    assert len(g1["t"]) <= 50 and len(g1["t"]) == len(g1["temp_c"]) == len(g1["sm_mhz"]) == len(g1["mem_temp_c"])
    # downsampling keeps the extremes: the 96 C peak and the 1300 MHz dip survive
    assert max(g1["temp_c"]) == 96 and min(g1["sm_mhz"]) == 1300
    # the thermal-violation stretch at full resolution: k 600..629 -> [t, t + 300]
    a = START + 600 * IV - pd["t0"]
    assert g1["throttled_intervals"] == [[a, a + 300]]
    assert g1["hot"] is True and pd["gpus"]["0"]["hot"] is False
    assert pd["gpus"]["0"]["throttled_intervals"] == []


# ---------------------------------------------------------------------------------------------- textfile
def test_textfile(tmp_path):
    gpus = {"0": {"temp": 96, "mtemp": 91, "sm": 1380, "tviol": 1}, "10": {"temp": 40}}
    nics = {"mlx5_3": {"link_downed": 1, "symbol_error": 4, "local_ack_timeout_err": 3412},
            "mlx5_3:2": {"local_ack_timeout_err": 1}}
    text = hh.render_textfile(1800000000.5, gpus, nics, {"local_ack_timeout_err"}, {"symbol_error"},
                              {"dmon_up": True, "bytes": 2048, "files": 2, "problems": 0})
    lines = text.splitlines()
    assert 'b300_gpu_temperature_celsius{gpu="0"} 96' in lines and 'b300_gpu_temperature_celsius{gpu="10"} 40' in lines
    assert 'b300_gpu_thermal_violation{gpu="0"} 1' in lines
    assert 'b300_rdma_hw_counter{device="mlx5_3",port="1",counter="local_ack_timeout_err"} 3412' in lines
    assert 'b300_rdma_hw_counter{device="mlx5_3",port="2",counter="local_ack_timeout_err"} 1' in lines
    assert 'b300_ib_port_counter{device="mlx5_3",port="1",counter="symbol_error"} 4' in lines
    assert not any("link_downed" in ln for ln in lines)          # node_exporter exports that one already
    assert "b300_health_history_last_sample_timestamp_seconds 1800000000.500" in lines
    assert "b300_health_history_dmon_up 1" in lines
    # every sample line belongs to a metric with HELP and TYPE before it
    names = [ln.split("{")[0].split(" ")[0] for ln in lines if not ln.startswith("#")]
    for name in set(names):
        assert "# TYPE %s" % name in " ".join(ln for ln in lines if ln.startswith("# TYPE")), name
    p = hh.write_textfile(str(tmp_path / "tf"), "b300_health_history.prom", text)
    assert pathlib.Path(p).read_text() == text and os.listdir(tmp_path / "tf") == ["b300_health_history.prom"]
    assert oct(os.stat(p).st_mode & 0o777) == "0o644"


# ---------------------------------------------------------------------------------------------- the sampler CLI
def _fake_smi(tmp_path, body):
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!%s\n%s" % (sys.executable, body))
    exe.chmod(0o755)
    return exe


def _run_sampler(args, timeout=60):
    return subprocess.run([sys.executable, str(SAMPLER)] + args, capture_output=True, text=True, timeout=timeout)


def test_sampler_once_on_the_real_capture(tmp_path):
    cap = REAL / "nvidia-h200x2-vm" / "dmon-s.txt"
    smi = _fake_smi(tmp_path, "import sys\nassert sys.argv[1:] == ['dmon', '-s', 'pucv', '-d', '10', '-c', '1'], "
                              "sys.argv\nsys.stdout.write(open(%r).read())\n" % str(cap))
    root = _sysfs(tmp_path, {"mlx5_0": {1: {"counters": {"symbol_error": 3}, "hw_counters": {"packet_seq_err": 1}}}})
    out = tmp_path / "hist"
    r = _run_sampler(["--once", "--out", str(out), "--nvidia-smi", str(smi), "--sysfs-root", str(root),
                      "--textfile-dir", str(tmp_path / "tf")])
    assert r.returncode == 0, r.stderr
    rec = json.loads(r.stdout)
    assert rec["g"]["1"] == {"pwr": 77, "temp": 31, "mtemp": 32, "util": 0, "mclk": 3201, "sm": 345, "pviol": 0,
                             "tviol": 0}
    assert rec["n"] == {"mlx5_0": {"symbol_error": 3, "packet_seq_err": 1}} and rec["full"] is True
    recs = _records(out / hh.CURRENT)
    assert "meta" in recs[0] and recs[1] == rec
    prom = (tmp_path / "tf" / "b300_health_history.prom").read_text()
    assert 'b300_rdma_hw_counter{device="mlx5_0",port="1",counter="packet_seq_err"} 1' in prom
    assert 'b300_ib_port_counter{device="mlx5_0",port="1",counter="symbol_error"} 3' in prom


def test_sampler_once_with_nothing_to_sample_exits_3(tmp_path):
    r = _run_sampler(["--once", "--out", str(tmp_path / "h"), "--nvidia-smi", str(tmp_path / "no-such-smi"),
                      "--sysfs-root", str(tmp_path)])
    assert r.returncode == 3 and "cannot run" in r.stderr
    recs = _records(tmp_path / "h" / hh.CURRENT)
    assert any("cannot run" in x.get("event", "") for x in recs)


@pytest.mark.parametrize("args,word", [(["--interval", "0"], "interval_s"), (["--out", "relative/dir"], "absolute"),
                                       (["--dmon-groups", "u"], "dmon_groups"), (["--max-files", "1"], "max_files")])
def test_sampler_refuses_bad_settings(tmp_path, args, word):
    args = (["--out", str(tmp_path / "h")] if "--out" not in args else []) + args
    r = _run_sampler(args + ["--once"])
    assert r.returncode == 2 and word in r.stderr


STREAM = """import os, sys, time
open(os.environ["PIDFILE"], "w").write(str(os.getpid()))
print("# gpu    pwr  gtemp  mtemp     sm    mem    enc    dec    jpg    ofa   mclk   pclk  pviol  tviol", flush=True)
print("# Idx      W      C      C      %      %      %      %      %      %    MHz    MHz      %   bool", flush=True)
k = 0
while True:
    for g in (0, 1):
        print("    %d    905     %d     91     97     48      0      0      0      0   3996   1380     12      %d"
              % (g, 90 + k % 8, int(k % 8 > 3)), flush=True)
    k += 1
    time.sleep(0.3)
"""


def test_sampler_runs_until_sigterm_and_leaves_no_dmon_behind(tmp_path):
    pidfile = tmp_path / "dmon.pid"
    smi = _fake_smi(tmp_path, STREAM)
    root = _sysfs(tmp_path, {"mlx5_0": {1: {"hw_counters": {"local_ack_timeout_err": 0}}}})
    out = tmp_path / "hist"
    env = dict(os.environ, PIDFILE=str(pidfile))
    p = subprocess.Popen([sys.executable, str(SAMPLER), "--out", str(out), "--interval", "1", "--nvidia-smi", str(smi),
                          "--sysfs-root", str(root), "--max-file-mb", "0.01", "--max-files", "2"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 20
        while time.time() < deadline:
            if (out / hh.CURRENT).exists() and sum(1 for r in _records(out / hh.CURRENT) if "g" in r) >= 4:
                break
            time.sleep(0.2)
        (root / "class/infiniband/mlx5_0/ports/1/hw_counters/local_ack_timeout_err").write_text("9\n")
        time.sleep(1.0)
        p.send_signal(signal.SIGTERM)
        _o, err = p.communicate(timeout=15)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "signal 15: stopping" in err
    dmon_pid = int(pidfile.read_text())
    time.sleep(0.2)
    with pytest.raises(ProcessLookupError):
        os.kill(dmon_pid, 0)
    res = hh.read_window(str(out), 600)
    assert res["available"] and res["gpus"]["0"]["max_temp_c"] >= 93
    assert res["gpus"]["0"]["hot"] is True and res["gpus"]["0"]["thermal_violation_s"] > 0
    assert res["nics"]["mlx5_0"]["local_ack_timeout_err"] == 9
    assert all(os.path.getsize(f) <= 0.01 * 1024 * 1024 or len(_records(f)) == 1
               for f in hh.history_files(str(out)))


def test_sampler_keeps_sampling_nics_when_dmon_fails(tmp_path):
    smi = _fake_smi(tmp_path, "import sys\nsys.stderr.write('Failed to initialize NVML: Driver/library version "
                              "mismatch\\n')\nsys.exit(18)\n")
    root = _sysfs(tmp_path, {"mlx5_0": {1: {"counters": {"link_downed": 0}}}})
    out = tmp_path / "hist"
    r = _run_sampler(["--out", str(out), "--interval", "1", "--nvidia-smi", str(smi), "--sysfs-root", str(root),
                      "--rounds", "2"])
    assert r.returncode == 0, r.stderr
    recs = _records(out / hh.CURRENT)
    events = [x["event"] for x in recs if "event" in x]
    assert any("exited rc 18: Failed to initialize NVML: Driver/library version mismatch; restart in 5 s" in e
               for e in events), events
    samples = [x for x in recs if "n" in x]
    assert len(samples) == 2 and all("g" not in s for s in samples)
    assert samples[0]["n"] == {"mlx5_0": {"link_downed": 0}}


# ---------------------------------------------------------------------------------------------- the module
def test_module_reads_the_window(two_hours, tmp_path):
    from test_facts_modules import run_module

    rc, res = run_module("health_history_read", {"dir": str(two_hours), "since": "100d"}, tmp_path, check=True)
    assert rc == 0, res
    assert res["changed"] is False and res["available"] is True
    assert res["window"]["samples"] == N
    assert res["gpus"]["0"]["hot"] is True and res["gpus"]["0"]["first_hot_epoch"] == START + 100 * IV
    assert res["nics"]["mlx5_3"]["local_ack_timeout_err"] == 100 + 30
    assert set(res["gpus"]["1"]) == {"samples", "max_temp_c", "max_mem_temp_c", "min_sm_clock_mhz", "max_power_w",
                                     "thermal_violation_s", "power_violation_s", "hot", "first_hot_epoch",
                                     "hot_reasons"}


def test_module_refuses_a_bad_duration(tmp_path):
    """The module file run directly (as AnsiballZ runs it, without the ansible CLI round trip)."""
    mod = ROOT / "collections/ansible_collections/b300/rollout/plugins/modules/health_history_read.py"
    args = tmp_path / "args.json"
    args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {"dir": str(tmp_path), "since": "6 hours"}}))
    env = dict(os.environ, PYTHONPATH=str(ROOT / "collections"))
    r = subprocess.run([sys.executable, str(mod), str(args)], capture_output=True, text=True, env=env, timeout=60)
    res = json.loads(r.stdout)
    assert r.returncode != 0 and res["failed"] and "duration '6 hours': expected e.g. 6h" in res["msg"]


# ---------------------------------------------------------------------------------------------- the plot
def _plot_thermal():
    import importlib.util
    spec = importlib.util.spec_from_file_location("plot_thermal", ROOT / "tools" / "plot_thermal.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_history_plot(two_hours, tmp_path):
    pytest.importorskip("matplotlib")
    from test_thermal import _png_size

    res = hh.read_window(str(two_hours), SINCE, now=NOW)
    (tmp_path / "window.json").write_text(json.dumps(res))
    out = tmp_path / "plot.png"
    rc = _plot_thermal().main(["--history", str(tmp_path / "window.json"), "--host", "b300b (SYNTHESIZED)",
                               "--out", str(out)])
    assert rc == 0
    assert _png_size(out) == (1320, 770) and out.stat().st_size > 20000
    keep = os.environ.get("HISTORY_PLOT_KEEP")
    if keep:
        pathlib.Path(keep).write_bytes(out.read_bytes())


def test_one_plotting_function_for_soak_and_history(two_hours, tmp_path, monkeypatch):
    pt = _plot_thermal()
    calls = []
    monkeypatch.setattr(pt, "plot_series", lambda series, out, title, *a, **kw: calls.append((title, kw)))
    res = hh.read_window(str(two_hours), SINCE, now=NOW)
    pt.plot_history(res, str(tmp_path / "h.png"), host="b300b")
    samples = thermal.parse_dmon((REAL / "nvidia-h200x2-vm" / "dmon-s.txt").read_text())["samples"]
    pt.plot(samples, thermal.analyse_host(samples, host="h200x2"), str(tmp_path / "s.png"))
    assert len(calls) == 2
    assert "HOT: GPU 1" in calls[0][0] and calls[0][1]["window"] == res["plot_data"]["window"]
    assert "thermal soak" in calls[1][0]
