"""The execution environment (execution-environment.yml, `make ee`) runs the on-call firmware audit against the
sandbox (issue 16).

The image localhost/b300-ee:latest is built by tools/build-ee.sh (ansible-builder + podman, offline), or reused when
its label matches the hash of the inputs. The audit runs INSIDE the EE container attached to the sandbox network
(podman network b300-sandbox), as the EE's own user (uid 1000, as AWX runs it), with the project checkout mounted
read-only at /runner/project (as AWX mounts a project) and ANSIBLE_COLLECTIONS_PATH set to the EE's collections
only, so b300.rollout comes from the image, not from the checkout. b300b runs the cx8_fw_mismatch scenario: the
report must name exactly b300b mlx5_3.

Building from nothing takes minutes (measured in the closing note); B300_EE_BUILD=0 runs the test only when the
image for the current inputs is already there (skipped with the reason otherwise).
"""
import json
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("EE_IMAGE", "localhost/b300-ee:latest")
BUILD = ROOT / "tools" / "build-ee.sh"
pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


@pytest.fixture(scope="module")
def ee_image(sandbox):
    cached = sandbox.run([str(BUILD), "--cached"], check=False).returncode == 0
    if not cached:
        if os.environ.get("B300_EE_BUILD") == "0":
            pytest.skip("B300_EE_BUILD=0 and no EE image for the current inputs (make ee builds it)")
        sandbox.run([str(BUILD)], timeout=1800)
    return IMAGE


def test_collection_in_the_ee_is_the_projects(sandbox, ee_image):
    r = sandbox.run(["podman", "run", "--rm", ee_image, "ansible-galaxy", "collection", "list", "b300.rollout",
                     "--format", "json"])
    listing = json.loads(r.stdout)
    assert {p: list(c) for p, c in listing.items()} == {"/usr/share/ansible/collections/ansible_collections":
                                                          ["b300.rollout"]}, listing
    r = sandbox.run(["podman", "run", "--rm", ee_image, "python3", "-c",
                     "import paramiko, ansible_runner, yaml, jinja2, ansible; print(ansible.__version__)"])
    assert r.stdout.strip() == "2.19.14"


def test_audit_from_the_ee_on_the_sandbox(sandbox, ee_image, tmp_path, request):
    keys = tmp_path / "keys"
    rep = tmp_path / "report"
    keys.mkdir()
    rep.mkdir()
    shutil.copy(sandbox.key, keys / "id_ed25519")
    os.chmod(keys / "id_ed25519", 0o600)
    for p in (keys, keys / "id_ed25519", rep):
        os.chown(p, 1000, 0)
    sandbox.scenarios_back_to_healthy(request)
    sandbox.scenario("b300b", "cx8_fw_mismatch")
    argv = ["podman", "run", "--rm", "--network", "b300-sandbox",
            "-v", "%s:/runner/project:ro" % ROOT, "-v", "%s:/runner/keys" % keys, "-v", "%s:/runner/report" % rep,
            "-w", "/runner/project",
            "-e", "ANSIBLE_CONFIG=/runner/project/ansible.cfg",
            "-e", "ANSIBLE_COLLECTIONS_PATH=/usr/share/ansible/collections",
            "-e", "ANSIBLE_CACHE_PLUGIN=memory", "-e", "ANSIBLE_LOCAL_TEMP=/tmp/ansible-local",
            "-e", "HOME=/tmp", "-e", "ANSIBLE_FORCE_COLOR=0",
            ee_image, "ansible-playbook", "playbooks/firmware_audit.yml", "-i", "inventory/sandbox",
            "-l", "b300a,b300b", "-c", "paramiko",
            "-e", "ansible_ssh_private_key_file=/runner/keys/id_ed25519",
            "-e", "audit_report_dir=/runner/report", "-e", "audit_report_name=ee"]
    r = sandbox.run(argv, check=False, timeout=900)
    out = r.stdout + r.stderr
    assert (rep / "ee.json").is_file(), out[-4000:]
    report = json.loads((rep / "ee.json").read_text())
    bad = [(x["host"], x["device"], x["verdict"]) for x in report["nic_rows"] if x["verdict"] not in ("ok", "ignored")]
    assert bad == [("b300b", "mlx5_3", "mismatch")], (bad, out[-3000:])
    assert {h: e["status"] for h, e in report["hosts"].items()} == {"b300a": "ok", "b300b": "fail"}
    assert report["summary"]["exit_code"] == 2
    assert "/runner/project/collections" not in out
