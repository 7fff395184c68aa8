"""The triage's parsers on REAL published text (tests/fixtures/real-world/{kmsg,devlink_health,nccl_warn,perftest,
rdma_counters}/), each compared with the answer written from the raw text."""
import json
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils import triage_counters as tc
from ansible_collections.b300.rollout.plugins.module_utils import triage_kmsg as tk
from ansible_collections.b300.rollout.plugins.module_utils import triage_traffic as tt

ROOT = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "real-world"


def cases(kind):
    return sorted((ROOT / kind).glob("*.txt"))


def answer(p):
    return json.loads(p.with_name(p.stem + ".answer.json").read_text())


def test_every_kind_has_fixtures_and_sources():
    for kind in ("kmsg", "devlink_health", "nccl_warn", "perftest", "rdma_counters"):
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
    "kmsg": lambda t: [(e["kind"], e["sub"], e["code"], e["bdf"], e["name"], e["gpu_pci"]) for e in tk.parse(t)],
    "devlink_health": tc.parse_devlink_health,
    "nccl_warn": lambda t: [(c["status"], c["hca"], c["vendor_err"]) for c in tt.parse_nccl_warns(t)["completions"]],
    "perftest": lambda t: (tt.parse_perftest(t)["rows"], tt.parse_perftest(t)["cuda_device"]),
    "rdma_counters": tc.parse_rdma_stat,
}


@pytest.mark.parametrize("path,copy", [pytest.param(p, c, id="%s/%s-%s" % (k, p.name, c)) for k in sorted(PARSE)
                                       for p in cases(k) for c in sorted(COPIES)])
def test_real_text_reads_the_same_when_copied(path, copy):
    """Pasted into a ticket, saved on Windows, cut without its last newline: the parse must not change."""
    parse = PARSE[path.parent.name]
    text = path.read_text()
    assert parse(COPIES[copy](text)) == parse(text)
