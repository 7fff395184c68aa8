"""Go-live acceptance on the sandbox (`make acceptance` path): the REAL sglang.bench_serving client (controller venv of
tools/acceptance/client_venv.sh) through the REAL sglang-router 0.3.2 over sglang-stub workers with their block prefix
cache and emulated NICs. Every figure here measures the tooling, not GPUs.

Checks per profile: report.json written under artifacts/acceptance/<UTC>/ with the `latest` link and the required
keys; servers' hit within 3 points of the target and agreeing with the responses; verdict accepted. PD: KV bytes
rose on every instance's --disaggregation-ib-device counters; with the transport forced to TCP on every instance
(Mooncake's quiet fallback, emulated by the stub control file `mooncake_transport`) the verdict is tcp_fallback and
names the instances.
kimi_k3 runs with an API key (the production default, issue 20 H3): deployed with the key (router and workers
keyed), the acceptance run passes through the keyed router (bench_serving gets OPENAI_API_KEY from the client), and
the key is in no artifact of the run (controller run dir, spec.json included), no ansible output (-v), no async job
file and no process argv sampled while the run goes. glm52_pd (deployed next, without a key) runs keyless, which
also leaves the fleet keyless for the tests after this module.
"""
import json
import os
import pathlib
import secrets
import subprocess
import tempfile
import time

import pytest
import yaml

from test_sglang_deploy import INVENTORY, ROOT, VENV_BIN, _env, on_host, deploy as _deploy

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]
LATEST = ROOT / "artifacts" / "acceptance" / "latest"


ASYNC_DIR = pathlib.Path(os.path.expanduser("~/.ansible_async"))


def deploy(profile, *extra):
    """The serving fleet for an acceptance run: playbooks/sglang_deploy.yml (what `make acceptance` needs deployed);
    site.yml's gates, NCCL and history before it are tests/integration/test_sglang_deploy.py's (~25 s per run less)."""
    return _deploy(profile, *extra, playbook="playbooks/sglang_deploy.yml")


def _argv_holding(needle):
    """Command lines of every process now running that contain needle (the controller runs the client here)."""
    found = []
    for d in pathlib.Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmd:
                found.append(cmd.replace(b"\0", b" ").decode(errors="replace")[:200])
    return found


def acceptance(profile, *extra, key=None):
    """Run playbooks/acceptance.yml; returns the report. With key: while it runs, every process argv is sampled for
    the key (a leak fails the test); the output and the run's files are checked afterwards by the caller."""
    subprocess.run([str(ROOT / "tools" / "acceptance" / "client_venv.sh")], cwd=ROOT, check=True, timeout=3600,
                   capture_output=True)
    cmd = [str(VENV_BIN / "ansible-playbook"), "-i", str(INVENTORY), "playbooks/acceptance.yml", "-l", "b300a,b300b",
           "-e", "sglang_profile=%s" % profile, "-e", "acceptance_fail_on_verdict=false", *extra]
    # the output goes to files, not pipes: nothing reads a pipe while the process table is sampled, and -v output
    # beyond the pipe's 64 KiB would block ansible-playbook on its write (a hang until the deadline)
    with tempfile.TemporaryFile("w+") as fout, tempfile.TemporaryFile("w+") as ferr:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=fout, stderr=ferr, text=True)
        leaks, samples, deadline = [], 0, time.monotonic() + 900
        while key and proc.poll() is None and time.monotonic() < deadline:
            leaks += _argv_holding(key)
            samples += 1
            time.sleep(0.3)
        try:
            proc.wait(timeout=max(1, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                proc.kill()
        fout.seek(0)
        ferr.seek(0)
        out, err = fout.read(), ferr.read()
    assert not leaks, "the API key was on a process command line during the acceptance run: %s" % leaks[:3]
    assert proc.returncode == 0, out[-6000:] + err[-3000:]
    assert "requests done" in out                             # progress lines while the client runs
    if key:
        assert samples > 10, "the run was too short to sample the process table (%d samples)" % samples
    rep = json.loads((LATEST / "report.json").read_text())
    rep["_output"] = out + err
    return rep


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


@pytest.fixture(scope="module")
def keyed_vars(tmp_path_factory):
    key = "sk-acc-" + secrets.token_hex(16)
    f = tmp_path_factory.mktemp("acckey") / "key.yml"
    f.write_text(yaml.safe_dump({"sglang_api_key": key}))
    f.chmod(0o600)
    return key, f


def test_kimi_k3_scaled_run_accepted_through_a_keyed_router(keyed_vars):
    key, vars_file = keyed_vars
    deploy("kimi_k3", "-e", "@%s" % vars_file)
    t0 = time.time()
    rep = acceptance("kimi_k3", "-e", "@%s" % vars_file, "-v", key=key)
    check_common(rep, "kimi_k3")
    assert rep["verdict"] == "accepted", rep["rule"]
    # the client warmed up through the keyed router and flushed every worker (with the key) before bench_serving
    result = json.loads((LATEST / "result.json").read_text())
    assert result["warmup"]["status"] == 200 and result["error"] is None
    assert sorted(result["flushed"]) == sorted(w["id"] for w in rep_ports())
    assert all(f["status"] == 200 for f in result["flushed"].values()), result["flushed"]
    spec = json.loads((LATEST / "spec.json").read_text())
    assert spec["api_key_stdin"] is True and "--flush-cache" not in spec["argv"]
    # the key is nowhere on disk or in the output
    leaked = [str(p) for p in LATEST.resolve().rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert not leaked, "API key in run artifacts: %s" % leaked
    assert key not in rep["_output"] and key[7:] not in rep["_output"], "API key in ansible-playbook -v output"
    assert "PLAY RECAP" in rep["_output"]
    # the client's async job result (module args incl. stdin = the key) must not stay on disk readable: ansible-core
    # leaves no job file for a no_log async task (checked by hand: the same task without no_log leaves one); any job
    # file of this run that is there must not hold the key
    jobs = [p for p in ASYNC_DIR.glob("*") if p.is_file() and p.stat().st_mtime >= t0] if ASYNC_DIR.is_dir() else []
    assert not [str(p) for p in jobs if key.encode() in p.read_bytes()], "API key in an async job result file"


def test_glm52_pd_scaled_run_rdma_then_tcp_fallback():
    deploy("glm52_pd")          # without the key: the fleet is keyless again for the tests after this module
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
