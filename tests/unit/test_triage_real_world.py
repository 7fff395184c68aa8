"""The triage's parsers on REAL published text (tests/fixtures/real-world/{kmsg,devlink_health,nccl_warn,perftest,
rdma_counters,ibqueryerrors,perfquery,ethtool_stats}/), each compared with the answer written from the raw text
(SOURCES.md beside the fixtures says how an answer is read from a text)."""
import json
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_counters as tc
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils.triage import triage_traffic as tt

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world"


KINDS = ("kmsg", "devlink_health", "nccl_warn", "perftest", "rdma_counters", "ibqueryerrors", "perfquery",
         "ethtool_stats")


def cases(kind):
    return sorted((ROOT / kind).glob("*.txt"))


def answer(p):
    return json.loads(p.with_name(p.stem + ".answer.json").read_text())


def same(got, want, where):
    """every key the answer states has the answer's value (the answer lists what the text says, not every field)"""
    for k, v in want.items():
        assert got.get(k) == v, (where, k, got.get(k), v)


def same_list(got, want, where):
    assert len(got) == len(want), (where, [g.get("raw", g) for g in got])
    for i, (g, w) in enumerate(zip(got, want)):
        same(g, w, "%s[%d]" % (where, i))


def test_every_kind_has_fixtures_and_sources():
    for kind in KINDS:
        fx = cases(kind)
        assert fx, kind
        src = (ROOT / kind / "SOURCES.md").read_text()
        for p in fx:
            assert p.name in src, (kind, p.name)
            assert p.with_name(p.stem + ".answer.json").is_file(), p


@pytest.mark.parametrize("path", cases("kmsg"), ids=lambda p: p.name)
def test_kmsg(path):
    ans = answer(path)
    events = tk.parse(path.read_text())
    assert len(events) == ans["events"], [e["raw"] for e in events]
    for bdf, kinds in (ans.get("by_bdf") or {}).items():
        for kind, n in kinds.items():
            assert sum(1 for e in events if e["bdf"] == bdf and e["kind"] == kind) == n, (bdf, kind)
    for name, kinds in (ans.get("by_name") or {}).items():
        for kind, n in kinds.items():
            assert sum(1 for e in events if e["name"] == name and e["kind"] == kind) == n, (name, kind)
    if "subs" in ans:
        subs = {}
        for e in events:
            subs[e["sub"]] = subs.get(e["sub"], 0) + 1
        assert subs == ans["subs"]
    if "codes" in ans:
        codes = {}
        for e in events:
            codes[e["code"]] = codes.get(e["code"], 0) + 1
        assert codes == ans["codes"]
    if "first_ts" in ans:
        assert events[0]["ts"] == ans["first_ts"] and events[-1]["ts"] == ans["last_ts"]
    if "bdf" in ans:
        assert {e["bdf"] for e in events} == {ans["bdf"]}
    for want in ans.get("xid", []):
        got = [e for e in events if e["kind"] == "xid"]
        assert got and got[0]["code"] == want["code"] and got[0]["gpu_pci"] == want["gpu_pci"]
        assert got[0]["meaning"] == want["meaning"] and got[0]["action"] == want["action"]
    if "list" in ans:
        same_list(events, ans["list"], path.name)


def test_kmsg_attribution_maps_bdf_and_name_to_the_nic_and_its_gpu():
    text = (ROOT / "kmsg" / "gpud1209_journalctl_mlx5_port_states.txt").read_text()
    maps = tk.device_maps({"devices": [{"name": "mlx5_5", "pci_address": "0000:ab:00.0", "netdevs": ["ibp171s0"]}]},
                          {"gpus": [{"index": 5, "pci_bus_id": "00000000:A9:00.0"}]}, {"mlx5_5": 5})
    sc = tk.scan(text, maps)
    assert list(sc["devices"]) == ["mlx5_5"]
    assert sc["devices"]["mlx5_5"]["ib_port_state"]["gpu"] == 5
    ucx = tk.scan((ROOT / "kmsg" / "ucx7738_pdsh_dmesg_create_dct_timeouts.txt").read_text(),
                  tk.device_maps({"devices": [{"name": "mlx5_2", "pci_address": "0000:61:00.0"}]}, None, {"mlx5_2": 2}))
    g = ucx["devices"]["mlx5_2"]["mlx5_cmd_timeout"]
    assert g["count"] == 8 and g["first"] == "14280.445220" and g["gpu"] == 2 and len(g["examples"]) == 3


@pytest.mark.parametrize("path", cases("devlink_health"), ids=lambda p: p.name)
def test_devlink_health(path):
    ans = answer(path)
    got = tc.parse_devlink_health(path.read_text())
    assert set(got) == set(ans["health"])
    for dev, reps in ans["health"].items():
        assert set(got[dev]) == set(reps)
        for rep, fields in reps.items():
            for k, v in fields.items():
                assert got[dev][rep][k] == v, (dev, rep, k)
    if "diagnose" in ans:
        d = tc.parse_devlink_diagnose(path.read_text().split("reporter port\n>\n", 1)[-1])
        assert d["syndrome"] == ans["diagnose"]["syndrome"] and d["description"] == ans["diagnose"]["description"]


def test_devlink_json_and_garbage():
    js = '{"health":{"pci/0000:5f:00.0":[{"reporter":"fw_fatal","state":"error","error":2,"recover":2,' \
         '"grace_period":1200000,"auto_recover":true}]}}'
    got = tc.parse_devlink_health(js)
    assert got["pci/0000:5f:00.0"]["fw_fatal"]["error"] == 2
    with pytest.raises(ValueError):
        tc.parse_devlink_health("kernel answers: Operation not supported")


@pytest.mark.parametrize("path", cases("nccl_warn"), ids=lambda p: p.name)
def test_nccl_warn(path):
    ans = answer(path)
    got = tt.parse_nccl_warns(path.read_text())
    assert got["warn_count"] == ans["warn_count"]
    assert len(got["completions"]) == len(ans["completions"])
    for g, a in zip(got["completions"], ans["completions"]):
        for k, v in a.items():
            assert g[k] == v, (k, g)
        assert g["raw"] and (g["hint"] or g["status"] not in tt.WC_HINT)
    for key in ("async_events", "ibv_failures", "comm_errors", "watchdog", "gdr_events", "gdr_gpu"):
        if key in ans:
            same_list(got.get(key) or [], ans[key], key)
    for key in ("gdr", "network", "ib_no_device"):
        if key in ans:
            assert got.get(key) == ans[key], (key, got.get(key))


@pytest.mark.parametrize("path", cases("perftest"), ids=lambda p: p.name)
def test_perftest(path):
    ans = answer(path)
    got = tt.parse_perftest(path.read_text())
    assert len(got["rows"]) == ans["rows"]
    for k in ("test", "device", "cuda_device"):
        assert got[k] == ans[k], k
    assert tt.perftest_gbps(got) == ans["gbps"]
    if ans.get("largest"):
        for k, v in ans["largest"].items():
            assert got["largest"][k] == v
    if "cuda_name" in ans:
        assert got["cuda_name"] == ans["cuda_name"]
    if "runs" in ans:
        runs = got.get("runs") or []
        assert len(runs) == len(ans["runs"]), [r.get("test") for r in runs]
        for r, a in zip(runs, ans["runs"]):
            assert len(r["rows"]) == a["rows"] and tt.perftest_gbps(r) == a["gbps"], (a["test"], r.get("unit"))
            same(r, {k: v for k, v in a.items() if k not in ("rows", "gbps", "largest")}, a["test"])
            same(r["largest"], a["largest"], a["test"])


@pytest.mark.parametrize("path", cases("ibqueryerrors"), ids=lambda p: p.name)
def test_ibqueryerrors(path):
    ans = answer(path)
    got = tc.parse_ibqueryerrors(path.read_text())
    same_list(got["ports"], ans["ports"], path.name)
    if "summary" in ans:
        same(got["summary"], ans["summary"], "summary")


@pytest.mark.parametrize("path", cases("perfquery"), ids=lambda p: p.name)
def test_perfquery(path):
    ans = answer(path)
    got = tc.parse_perfquery(path.read_text())
    assert len(got) == len(ans["blocks"])
    for g, a in zip(got, ans["blocks"]):
        assert len(g["counters"]) == a["counters_n"], sorted(g["counters"])
        same(g, {k: v for k, v in a.items() if k not in ("counters", "counters_n")}, path.name)
        same(g["counters"], a["counters"], path.name)


@pytest.mark.parametrize("path", cases("ethtool_stats"), ids=lambda p: p.name)
def test_ethtool_stats(path):
    ans = answer(path)
    got = tc.parse_ethtool_stats(path.read_text())
    assert len(got) == ans["counters_n"], sorted(got)
    same(got, ans["counters"], path.name)


@pytest.mark.parametrize("path", cases("rdma_counters"), ids=lambda p: p.name)
def test_rdma_counters(path):
    ans = answer(path)
    got = tc.parse_rdma_stat(path.read_text())
    assert set(got) == set(ans["links"])
    for link, a in ans["links"].items():
        assert len(got[link]) == a["counters"], sorted(got[link])
        for k, v in a.items():
            if k != "counters":
                assert got[link][k] == v


COPIES = {
    "crlf": lambda t: t.replace("\r\n", "\n").replace("\n", "\r\n"),
    "trailing_spaces": lambda t: "\n".join(ln + "   " if ln.strip() else ln for ln in t.split("\n")),
    "no_final_newline": lambda t: t.rstrip("\r\n"),
}
PARSE = {
    "kmsg": lambda t: [(e["kind"], e["sub"], e["code"], e["bdf"], e["name"], e["netdev"], e["gpu_pci"], e.get("errors"))
                       for e in tk.parse(t)],
    "devlink_health": tc.parse_devlink_health,
    "nccl_warn": lambda t: ([(c["status"], c["hca"], c["vendor_err"]) for c in tt.parse_nccl_warns(t)["completions"]],
                           [(a["hca"], a["text"]) for a in tt.parse_nccl_warns(t)["async_events"]],
                           tt.parse_nccl_warns(t).get("watchdog"), tt.parse_nccl_warns(t).get("gdr")),
    "perftest": lambda t: (tt.parse_perftest(t)["rows"], tt.parse_perftest(t)["cuda_device"],
                          [(r["test"], r["rows"]) for r in tt.parse_perftest(t).get("runs") or []]),
    "rdma_counters": tc.parse_rdma_stat,
    "ibqueryerrors": lambda t: tc.parse_ibqueryerrors(t),
    "perfquery": lambda t: tc.parse_perfquery(t),
    "ethtool_stats": lambda t: tc.parse_ethtool_stats(t),
}


@pytest.mark.parametrize("path,copy", [pytest.param(p, c, id="%s/%s-%s" % (k, p.name, c)) for k in sorted(PARSE)
                                       for p in cases(k) for c in sorted(COPIES)])
def test_real_text_reads_the_same_when_copied(path, copy):
    """Pasted into a ticket, saved on Windows, cut without its last newline: the parse must not change."""
    parse = PARSE[path.parent.name]
    text = path.read_text()
    assert parse(COPIES[copy](text)) == parse(text)
