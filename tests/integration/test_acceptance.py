"""Go-live acceptance on the sandbox (`make acceptance` path): the REAL sglang.bench_serving client (controller venv of
tools/acceptance/client_venv.sh) through the REAL sglang-router 0.3.2 over sglang-stub workers with their block prefix
cache and emulated NICs. Every figure here measures the tooling, not GPUs.

Checks per profile: report.json written under artifacts/acceptance/<UTC>/ with the `latest` link and the required
keys; servers' hit within 3 points of the target and agreeing with the responses; verdict accepted. PD: KV bytes
rose on every instance's --disaggregation-ib-device counters; with the transport forced to TCP on every instance
(Mooncake's quiet fallback, emulated by the stub control file `mooncake_transport`) the verdict is tcp_fallback and
names the instances.
"""
import json
import subprocess

import pytest

from test_sglang_deploy import INVENTORY, ROOT, VENV_BIN, _env, deploy, on_host  # pylint: disable=import-error

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]
LATEST = ROOT / "artifacts" / "acceptance" / "latest"


def acceptance(profile, *extra):
    subprocess.run([str(ROOT / "tools" / "acceptance" / "client_venv.sh")], cwd=ROOT, check=True, timeout=3600,
                   capture_output=True)
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY), "playbooks/acceptance.yml", "-l", "b300a,b300b",
           "-e", "sglang_profile=%s" % profile, "-e", "acceptance_fail_on_verdict=false", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "requests done" in proc.stdout                     # progress lines while the client runs
    return json.loads((LATEST / "report.json").read_text())


def rep_ports():
    """The worker instances (id, port) of the last acceptance run's plan (report.json's argv has none: use spec)."""
    spec = json.loads((LATEST / "spec.json").read_text())
    return [{"id": w["id"], "port": int(w["url"].rsplit(":", 1)[1])} for w in spec["workers"]]


def check_common(rep, profile):
    for key in ("profile", "verdict", "requests", "output_throughput_tok_s", "cache_hit_rate", "seed"):
        assert key in rep
    assert rep["profile"] == profile and "tooling" in rep["label"]
    ch = rep["cache_hit_rate"]
    assert abs(ch["counters"] - ch["target"]) * 100 <= 3, ch
    assert ch["agree"], ch
    assert rep["requests"]["failed"] == 0
    for png in ("throughput.png", "latency.png", "cache_hit.png"):
        assert (LATEST / png).stat().st_size > 0
    assert 'verdict="%s"} 1' % rep["verdict"] in (LATEST / "acceptance.prom").read_text()


def test_kimi_k3_scaled_run_accepted():
    deploy("kimi_k3")
    rep = acceptance("kimi_k3")
    check_common(rep, "kimi_k3")
    assert rep["verdict"] == "accepted", rep["rule"]


def test_glm52_pd_scaled_run_rdma_then_tcp_fallback():
    deploy("glm52_pd")
    rep = acceptance("glm52_pd")
    check_common(rep, "glm52_pd")
    assert rep["verdict"] == "accepted", rep["rule"]
    assert rep["rdma"] and all(r["verdict"] == "rdma" and r["bytes"] > 0 for r in rep["rdma"].values()), rep["rdma"]
    # the units' service user cannot create /run/sglang-stub/<port> itself (tools/reliability.py does the same)
    force = ("for p in %s; do mkdir -p /run/sglang-stub/$p && chmod 755 /run/sglang-stub /run/sglang-stub/$p && "
             "echo tcp > /run/sglang-stub/$p/mooncake_transport && chmod 644 /run/sglang-stub/$p/mooncake_transport; "
             "done" % " ".join(str(i["port"]) for i in rep_ports()))
    on_host("b300a", force)
    on_host("b300b", force)
    try:
        rep = acceptance("glm52_pd")
    finally:
        on_host("b300a", "rm -f /run/sglang-stub/*/mooncake_transport")
        on_host("b300b", "rm -f /run/sglang-stub/*/mooncake_transport")
    assert rep["verdict"] == "tcp_fallback", rep["rule"]
    assert all(r["verdict"] == "tcp_fallback" for r in rep["rdma"].values())
    assert all(i in rep["rule"] for i in rep["rdma"])
