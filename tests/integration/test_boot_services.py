"""Issue 12 item 4 (reboot): the GPU boot-services preflight fails on a host where it is false, before any change.

The sandbox hosts carry emulated nvidia-persistenced / nvidia-fabricmanager units (sandbox/hwemu/units, enabled by
`fleet.sh` provisioning) and every sandbox deploy runs the check (sglang_gpu_boot_check, role default true). Here
nvidia-fabricmanager is disabled on b300b: the deploy must stop in preflight naming the host, the unit and the fix,
with nothing changed on either host (PLAY RECAP changed=0); enabled again, the same preflight passes.
"""
import re

import pytest

from test_sglang_deploy import recap

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


def _preflight(sandbox):
    return sandbox.ansible_playbook("playbooks/sglang_deploy.yml", "-e", "sglang_profile=kimi_k3",
                                    "--tags", "preflight", limit="b300a,b300b",
                                    check=False, timeout=600)


def test_fabricmanager_not_enabled_is_refused_before_any_change(sandbox):
    for h in ("b300a", "b300b"):
        state = sandbox.exec(h, "systemctl is-enabled nvidia-fabricmanager.service nvidia-persistenced.service",
                             check=False).stdout.split()
        assert state == ["enabled", "enabled"], (h, state, "fleet.sh provisioning did not enable the emulated units")
    sandbox.exec("b300b", "systemctl disable nvidia-fabricmanager.service")
    try:
        r = _preflight(sandbox)
        out = re.sub(r"\s+", " ", r.stdout)
        assert r.returncode != 0, r.stdout[-3000:]
        assert ("b300b: reboot readiness: found nvidia-fabricmanager.service not enabled; persistence mode on; "
                "expected every one of nvidia-persistenced.service, nvidia-fabricmanager.service enabled") in out, \
            r.stdout[-3000:]
        assert "Fix: systemctl enable --now nvidia-persistenced.service nvidia-fabricmanager.service" in out
        assert "b300a: reboot readiness" not in out
        for host, counts in recap(r.stdout).items():
            assert counts["changed"] == 0, (host, counts)
    finally:
        sandbox.exec("b300b", "systemctl enable nvidia-fabricmanager.service")
    ok = _preflight(sandbox)
    assert ok.returncode == 0, ok.stdout[-3000:]
