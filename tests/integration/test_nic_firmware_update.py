"""Issue 29: the ConnectX firmware update (playbooks/nic_firmware_update.yml) on the sandbox, against the EMULATED NICs
(sandbox/hwemu/fwtools.py: burn, image query/verify, mlxfwreset; no real firmware is ever burned here).

One kimi_k3 fleet serves for the whole module (deployed once when it does not serve: stub workers, REAL router 0.3.2
behind its HAProxy front); b300b runs scenario `cx8_fw_mismatch` (mlx5_3 at 40.44.1036 under DOCA-OFED 25.10-1.2.2,
which expects 40.47.1026); its CX8s refuse a live reset (level 3), so the update takes the reboot path
(sandbox/fleet.sh reboot, the inventory's nic_firmware_update_reboot_command). Images are synthesized on the
controller (sandbox/hwemu/fwimage.py) and given as air-gapped controller files with their sha256.
Order matters: the refusals first (nothing may change), then the real update; a finalizer leaves both hosts healthy.
Figures (requests sent/failed through the router during the update, step times) go to
artifacts/firmware-update/test-figures.json.
"""
import hashlib
import json
import pathlib
import threading
import time
import urllib.request

import pytest

import fwimage
import loadgen

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTER = "http://10.89.30.11:30080"
PLAYBOOK = "playbooks/nic_firmware_update.yml"
WORKERS = ["http://10.89.30.11:30000", "http://10.89.30.12:30000"]
UNIT = "sglang-kimi_k3-w0.service"
PSID, TARGET, OLD = "MT_0000001217", "40.47.1026", "40.44.1036"
LOCK = "/var/lib/b300-maintenance/lock"
FIGURES = {}

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


def healthy_workers():
    try:
        with urllib.request.urlopen(ROUTER + "/workers", timeout=10) as resp:
            return sorted(w["url"] for w in json.loads(resp.read())["workers"] if w["is_healthy"])
    except OSError:
        return []


def image(tmp, name, psid):
    path = tmp / name
    fwimage.write_image(str(path), psid, TARGET)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return {"psid": PSID, "version": TARGET, "sha256": sha, "path": str(path), "where": "controller"}


@pytest.fixture(scope="module")
def fleet(sandbox, request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fw")
    sandbox.scenarios_back_to_healthy(request)
    sandbox.scenario("b300a", "healthy")
    sandbox.scenario("b300b", "cx8_fw_mismatch")
    t = time.monotonic()
    if healthy_workers() != WORKERS:
        r = sandbox.run(["ansible-playbook", "-i", sandbox.inventory, "playbooks/sglang_deploy.yml", "-l", "b300a,b300b",
                         "-e", "sglang_profile=kimi_k3"], check=False, timeout=1500)
        assert r.returncode == 0 and healthy_workers() == WORKERS, (r.stdout + r.stderr)[-4000:]
    FIGURES["deploy_s"] = round(time.monotonic() - t, 1)
    pci = sandbox.exec("b300b", "basename $(readlink -f /opt/hwemu/sys/class/infiniband/mlx5_3/device)").stdout.strip()
    good, wrong = image(tmp, "cx8-good.bin", PSID), image(tmp, "cx8-wrong-psid.bin", "MT_0000001218")
    (tmp / "vars").mkdir()     # not beside the reports: a report named like a vars file would replace it
    for name, imgs in (("good", [good]), ("wrong", [wrong])):
        (tmp / "vars" / ("%s.json" % name)).write_text(json.dumps({"nic_firmware_update_images": imgs}))
    yield {"sb": sandbox, "tmp": tmp, "pci": pci}
    out = ROOT / "artifacts" / "firmware-update"
    out.mkdir(parents=True, exist_ok=True)
    (out / "test-figures.json").write_text(json.dumps(FIGURES, indent=1) + "\n")


def run_update(f, images, *extra, timeout=1200):
    argv = ["ansible-playbook", "-i", f["sb"].inventory, PLAYBOOK, "-l", "b300a,b300b", "-e", "sglang_profile=kimi_k3",
            "-e", "@%s" % (f["tmp"] / "vars" / ("%s.json" % images)), "-e", "nic_firmware_update_report_dir=%s" % f["tmp"],
            "-e", "nic_firmware_update_report_name=%s" % images] + list(extra)
    t = time.monotonic()
    r = f["sb"].run(argv, check=False, timeout=timeout)
    return r.returncode, r.stdout + r.stderr, round(time.monotonic() - t, 1)


def nic_state(f):
    """What could change: mlx5_3's flash and running image, the lock, the images' directory, b300b's worker process."""
    sb = f["sb"]
    q = sb.exec("b300b", "/opt/hwemu/bin/flint -d mlx5_3 q").stdout
    return {"flint": [ln for ln in q.splitlines() if ln.startswith("FW Version")],
            "sysfs": sb.exec("b300b", "cat /opt/hwemu/sys/class/infiniband/mlx5_3/fw_ver").stdout.strip(),
            "lock": sb.exec("b300b", "test -e %s && echo yes || echo no" % LOCK).stdout.strip(),
            "images_dir": sb.exec("b300b", "test -e /var/tmp/b300-nic-firmware && echo yes || echo no").stdout.strip(),
            "worker": sb.exec("b300b", "systemctl show -p InvocationID --value %s" % UNIT).stdout.strip(),
            "router": healthy_workers()}


def report(f, name):
    return json.loads((f["tmp"] / ("%s.json" % name)).read_text())


def test_pd_refused_without_the_maintenance_flag_first(fleet):
    before = nic_state(fleet)
    rc, out, secs = run_update(fleet, "good", "-e", "sglang_profile=glm52_pd")
    FIGURES["pd_refusal_s"] = secs
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert "REFUSED before anything is read or changed: profile glm52_pd is prefill/decode disaggregated" in text, \
        out[-3000:]
    assert "-e nic_firmware_update_maintenance=true" in text
    # said first: the refusal is the first task of the run that did anything (no facts read, no per-host play)
    assert "Firmware update | one host at a time" not in out and "Read RDMA NICs" not in out, out[-3000:]
    assert nic_state(fleet) == before


def test_wrong_psid_refused_before_any_change(fleet):
    before = nic_state(fleet)
    assert before["flint"] == ["FW Version:            %s" % OLD] and before["router"] == WORKERS, before
    rc, out, secs = run_update(fleet, "wrong")
    FIGURES["wrong_psid_refusal_s"] = secs
    assert rc != 0, out[-3000:]
    text = " ".join(out.split())
    assert ("mlx5_3 (%s, PSID %s): the image's own PSID is MT_0000001218, the device's %s (flint -i query): refused"
            % (fleet["pci"], PSID, PSID)) in text, out[-4000:]
    assert not [ln for ln in out.splitlines() if ln.startswith(("changed: [b300b]", "ok: [b300b]")) and "Take out" in ln]
    assert nic_state(fleet) == before
    rep = report(fleet, "wrong")
    assert rep["summary"]["exit_code"] == 2
    assert {h["host"]: (h["status"], h["stage"]) for h in rep["hosts"]} == {"b300a": ("skipped", "done"),
                                                                           "b300b": ("refused", "image")}
    assert "nothing was changed" in next(d for d in rep["hosts"][1]["devices"] if d["device"] == "mlx5_3")["state"]


def test_check_mode_shows_burn_and_reboot_and_touches_nothing(fleet):
    before = nic_state(fleet)
    rc, out, secs = run_update(fleet, "good", "--check")
    FIGURES["check_mode_s"] = secs
    assert rc == 0, out[-4000:]
    text = " ".join(out.split())
    assert "would run: /opt/hwemu/bin/flint -d %s -i /var/tmp/b300-nic-firmware/cx8-good.bin -y burn" % fleet["pci"] \
        in text, out[-4000:]
    assert "activation: reboot: no supported live reset level on mlx5_3" in text
    assert nic_state(fleet) == before
    rep = report(fleet, "good")
    assert rep["summary"]["check_mode"] is True
    assert {h["host"]: h["status"] for h in rep["hosts"]} == {"b300a": "skipped", "b300b": "would_update"}


class Load:
    """Chat completions through the router's front while the update runs (bounded: 20 min, 3 in flight, ~4/s).
    Also measures test_host_stack_fleet.py's reboot of a serving host (prompt: the requests' text)."""

    def __init__(self, prompt="fw-update"):
        loadgen.check_target(ROUTER)
        self.prompt = prompt
        self.records, self.stop, self.lock = [], threading.Event(), threading.Lock()
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(3)]

    def _run(self):
        seq = 0
        while not self.stop.is_set() and time.monotonic() - self.t0 < 1200:
            rec = loadgen.one_request(ROUTER, seq, self.t0, 15, False, "Kimi-K3", self.prompt, {})
            with self.lock:
                self.records.append(rec)
            seq += 1
            time.sleep(0.75)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        time.sleep(3)
        self.stop.set()
        for t in self.threads:
            t.join(30)

    def figures(self):
        failed = [r for r in self.records if not r["ok"]]
        workers = {}
        for r in self.records:
            workers[r.get("worker") or "?"] = workers.get(r.get("worker") or "?", 0) + 1
        return {"sent": len(self.records), "ok": len(self.records) - len(failed), "failed": len(failed),
                "errors": sorted({(r["error"] or "")[:80] for r in failed}), "per_worker": workers}


def test_mismatch_fixed_end_to_end_while_serving(fleet):
    before = nic_state(fleet)
    with Load() as load:
        rc, out, secs = run_update(fleet, "good")
    FIGURES["update_s"] = secs
    FIGURES["load"] = load.figures()
    (ROOT / "artifacts" / "firmware-update").mkdir(parents=True, exist_ok=True)
    (ROOT / "artifacts" / "firmware-update" / "test-update.log").write_text(out)
    assert rc == 0, out[-5000:]
    rep = report(fleet, "good")
    b = next(h for h in rep["hosts"] if h["host"] == "b300b")
    FIGURES["b300b_timings_s"] = b["timings"]
    assert load.figures()["failed"] == 0 and load.figures()["sent"] > 20, load.figures()
    assert rep["summary"]["exit_code"] == 0 and {h["host"]: h["status"] for h in rep["hosts"]} == {
        "b300a": "skipped", "b300b": "updated"}
    assert b["activation"]["method"] == "reboot"
    assert b["verify"]["ok"] and b["verify"]["devices"] == [
        {"device": "mlx5_3", "target": TARGET, "running": TARGET, "pending": None, "ok": True}]
    assert [d["device"] for d in b["devices"] if d["action"] == "burn"] == ["mlx5_3"]
    after = nic_state(fleet)
    assert after["flint"] == ["FW Version:            %s" % TARGET] and after["sysfs"] == TARGET, after
    assert after["lock"] == "no" and after["images_dir"] == "no" and after["router"] == WORKERS, after
    assert after["worker"] != before["worker"], "b300b's worker was not restarted (it was rebooted)"
    # the audit shows the new versions: every NIC ok, exit 0
    r = fleet["sb"].run([str(ROOT / "tools" / "fw-audit"), "-i", "inventory/sandbox", "-l", "b300a,b300b", "--json",
                         "--report-dir", str(fleet["tmp"])], check=False, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    audit = json.loads(r.stdout)
    row = next(x for x in audit["nic_rows"] if x["host"] == "b300b" and x["device"] == "mlx5_3")
    assert (row["fw"], row["verdict"]) == (TARGET, "ok")
    # a second run finds nothing to do: no burn, no reset, the host not taken out
    rc, out, secs = run_update(fleet, "good")
    FIGURES["rerun_nothing_to_do_s"] = secs
    assert rc == 0, out[-3000:]
    assert {h["host"]: h["status"] for h in report(fleet, "good")["hosts"]} == {"b300a": "skipped", "b300b": "skipped"}
    assert nic_state(fleet)["worker"] == after["worker"]
