"""tools/fw-audit's Markdown (playbooks/templates/firmware_audit.md.j2) says when no GPU was audited instead of
"GPU problems: none" (issue 21), rendered from fw_matrix.audit_fleet's report with the playbook's template."""
import pathlib

import jinja2

from ansible_collections.b300.rollout.plugins.module_utils.hw import fw_matrix

ROOT = pathlib.Path(__file__).resolve().parents[2]


def render(report):
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(ROOT / "playbooks" / "templates")), trim_blocks=True)
    env.filters["dictsort"] = lambda d: sorted(d.items())
    return env.get_template("firmware_audit.md.j2").render(audit_report=report)


def gpu_topo():
    return {"driver_version": "580.159.04", "gpu_count": 1,
            "gpus": [{"index": 0, "name": "NVIDIA B300 SXM6 AC", "vbios_version": "97.10.4B.00.02",
                      "nvlink": {"links_down": 0}}]}


def test_every_host_unreachable_says_no_gpu_was_audited():
    rep = fw_matrix.audit_fleet({"b300a": {"status": "unreachable", "msg": "ssh: timeout"},
                                 "b300b": {"status": "unreachable", "msg": "ssh: timeout"}}, [])
    md = render(rep)
    assert "GPU problems: none" not in md
    assert "GPU problems: unknown: no GPU was audited (no host answered)" in md


def test_hosts_without_gpu_facts_say_so():
    rep = fw_matrix.audit_fleet({"b300a": {"status": "ok", "msg": "", "rdma_nics": {"driver": {}, "devices": []},
                                           "gpu_topology": None}}, [])
    md = render(rep)
    assert "GPU problems: unknown: no GPU was audited (no host returned GPU facts)" in md


def test_audited_gpus_are_counted():
    rep = fw_matrix.audit_fleet({"b300a": {"status": "ok", "msg": "", "rdma_nics": {"driver": {}, "devices": []},
                                           "gpu_topology": gpu_topo()},
                                 "b300y": {"status": "unreachable", "msg": "ssh: timeout"}}, [])
    md = render(rep)
    assert "GPU problems: none (GPUs of 1 of 2 hosts audited)" in md
