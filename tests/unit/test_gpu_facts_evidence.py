"""Evidence check: parsing the raw nvidia-smi outputs captured on the real GPU machine gives exactly the facts the
module returned there (docs/evidence/h200x2/gpu_facts/, produced by tools/device/gpu_facts_run.sh; the lead copies $OUT there)."""
import json
import pathlib

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import build_gpu_topology

EVIDENCE = pathlib.Path(__file__).resolve().parents[2] / "docs" / "evidence" / "h200x2" / "gpu_facts"

pytestmark = pytest.mark.skipif(
    not EVIDENCE.is_dir(),
    reason="docs/evidence/h200x2/gpu_facts/ does not exist yet: the lead runs tools/device/gpu_facts_run.sh on the GPU machine "
           "and copies its $OUT there")


def _read(name):
    p = EVIDENCE / name
    assert p.is_file(), "evidence file missing: %s" % p
    return p.read_text()


def test_parse_of_raw_outputs_equals_live_facts():
    live = json.loads(_read("gpu_topology_facts.json"))
    parsed = build_gpu_topology(_read("raw/q.xml"), _read("raw/topo.txt"), _read("raw/nvlink-s.txt"),
                                sysfs_root=str(EVIDENCE / "sys"))
    if "affinity_disagreements" not in live:
        # evidence recorded before the key was added (issue 13); no RDMA devices in that sysfs, so it is empty
        assert parsed.pop("affinity_disagreements") == []
    assert json.loads(json.dumps(parsed)) == live


def test_live_facts_are_a_real_h200_run():
    live = json.loads(_read("gpu_topology_facts.json"))
    assert live["gpu_count"] >= 1 and live["gpu_count"] == len(live["gpus"])
    assert all(g["name"].startswith("NVIDIA H200") for g in live["gpus"])
    assert live["driver_version"]
    timing = json.loads(_read("timing.json"))
    assert timing["module_total_s"]["median"] > 0 and timing["bare_nvidia_smi_q_x_s"]["median"] > 0
