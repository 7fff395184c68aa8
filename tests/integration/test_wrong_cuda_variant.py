"""Issue 12 item 1: a wheelhouse holding the WRONG transfer-engine build is refused before any unit is touched.

glm52_pd is deployed (as the other sandbox tests leave it), then deployed again from a wheelhouse that also holds the
REAL plain `mooncake-transfer-engine` wheel (its engine.so needs libcudart.so.12) with sglang_mooncake_package pointed
at it: the venv coherence check after the install must refuse, naming the package and both CUDA majors (12 found, 13
for sglang 0.5.17), and no SGLang unit may restart. The venv is put back with the default (CUDA 13) package after.
"""
import os
import pathlib
import re

import pytest

from test_sglang_deploy import unit_props

from test_sglang_venv_check import _wheel

ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]
UNITS = {"b300a": ["sglang-glm52_pd-p0.service", "sglang-glm52_pd-p1.service"],
         "b300b": ["sglang-glm52_pd-d0.service", "sglang-glm52_pd-d1.service"]}


def _deploy(sandbox, *extra):
    return sandbox.ansible_playbook("playbooks/sglang_deploy.yml", "-e", "sglang_profile=glm52_pd", *extra,
                                    limit="b300a,b300b", check=False, timeout=900)


def test_cuda12_transfer_engine_refused_nothing_restarted(sandbox, tmp_path):
    before = {(h, u): unit_props(h, u) for h, us in UNITS.items() for u in us}
    if not all(p["ActiveState"] == "active" for p in before.values()):   # glm52_pd not serving yet (run alone)
        first = _deploy(sandbox)
        assert first.returncode == 0, first.stdout[-4000:]
        before = {(h, u): unit_props(h, u) for h, us in UNITS.items() for u in us}
    assert all(p["ActiveState"] == "active" and int(p["MainPID"]) > 0 for p in before.values()), before
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    for whl in (ROOT / ".cache" / "wheelhouse").glob("*.whl"):
        os.link(whl, wheelhouse / whl.name)
    plain = _wheel("mooncake_transfer_engine-0.3.13.post1-*.whl", "mooncake-transfer-engine==0.3.13.post1")
    os.link(plain, wheelhouse / os.path.basename(plain))
    try:
        bad = _deploy(sandbox, "-e", "sglang_wheelhouse_dir=%s" % wheelhouse,
                      "-e", "sglang_mooncake_package=mooncake-transfer-engine",
                      "-e", '{"sglang_mooncake_remove_packages": ["mooncake-transfer-engine-cuda13"]}')
        out = re.sub(r"\s+", " ", bad.stdout)
        assert bad.returncode != 0, bad.stdout[-4000:]
        for host in UNITS:
            assert re.search(r"%s: the venv \S+ is not coherent \(nothing was restarted\): .*?%s: \S+/mooncake/engine\.so "
                             r"\(mooncake-transfer-engine\) links libcudart\.so\.12 \(CUDA 12\) but the venv is CUDA 13 "
                             r"\(expected 13\); fix: install mooncake-transfer-engine-cuda13" % (host, host), out), \
                bad.stdout[-4000:]
        after = {k: unit_props(*k) for k in before}
        for key, props in before.items():
            assert (after[key]["MainPID"], after[key]["ActiveEnterTimestamp"]) == (
                props["MainPID"], props["ActiveEnterTimestamp"]), (key, "restarted by the refused run")
    finally:   # the CUDA 13 build back in the venvs (the default package removes the plain one first)
        back = _deploy(sandbox, "--tags", "install")
        assert back.returncode == 0, back.stdout[-4000:]
