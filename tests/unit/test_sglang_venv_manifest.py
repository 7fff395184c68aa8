"""A no-op `pip install` is skipped only when the venv still holds what its last good install put there
(module_utils/sglang/venv_manifest.py, module b300.rollout.sglang_venv_manifest; issue 40: pip start-up cost 1-3 s per
venv and re-run). These tests build venvs of dist-info directories the way pip writes them (`<name>-<version>.dist-info/
METADATA` with `Name:` and `Version:` headers, the core metadata format of PEP 566) and prove that every change pip
would have to act on (another pin, a missing or changed distribution, one that must be absent, no record) makes pip
run, and that a matching venv does not."""
import json

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.sglang import venv_manifest as vm
from test_facts_modules import run_module


def _dist(venv, name, version, meta_name=None):
    d = venv / "lib" / "python3.12" / "site-packages" / ("%s-%s.dist-info" % (name.replace("-", "_"), version))
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: x\n\nName: not-this\n"
                                % (meta_name or name, version))


@pytest.fixture
def venv(tmp_path):
    v = tmp_path / "0.5.18"
    _dist(v, "sglang", "0.5.18")
    _dist(v, "cuda-tile", "1.6.0rc5", meta_name="Cuda_Tile")
    return v


PINS = ["sglang==0.5.18", "cuda-tile==1.6.0rc5"]


def test_installed_reads_names_and_versions_from_dist_info(venv):
    assert vm.installed(str(venv)) == {"sglang": "0.5.18", "cuda-tile": "1.6.0rc5"}
    assert vm.parse_metadata("Name: a\n") is None
    assert vm.canonical("Mooncake_Transfer.Engine") == "mooncake-transfer-engine"


def test_no_record_runs_pip_then_a_record_skips_it(venv):
    now = vm.installed(str(venv))
    assert vm.mismatches(PINS, [], now, vm.read_record(str(venv))) == ["no record of a good install"]
    vm.write_record(str(venv), PINS, [], now)
    assert vm.mismatches(list(reversed(PINS)), [], vm.installed(str(venv)), vm.read_record(str(venv))) == []


def test_every_change_pip_would_act_on_runs_pip(venv):
    vm.write_record(str(venv), PINS, ["mooncake-transfer-engine"], vm.installed(str(venv)))
    rec = vm.read_record(str(venv))
    now = vm.installed(str(venv))
    assert vm.mismatches(["sglang==0.5.19", PINS[1]], ["mooncake-transfer-engine"], now, rec) == [
        "sglang 0.5.18 is installed (pinned 0.5.19)", "the record is for other pins (cuda-tile==1.6.0rc5, sglang==0.5.18)"]
    _dist(venv, "mooncake-transfer-engine", "0.3.7")
    now = vm.installed(str(venv))
    assert vm.mismatches(PINS, ["mooncake-transfer-engine"], now, rec) == [
        "mooncake-transfer-engine 0.3.7 is installed (must be absent)",
        "the venv changed since the record: mooncake-transfer-engine absent -> 0.3.7"]
    assert vm.mismatches(PINS + ["mooncake-transfer-engine-cuda13"], [], now, rec)[0] == (
        "mooncake-transfer-engine-cuda13 is not installed")
    (venv / vm.RECORD_NAME).write_text("{not json")
    assert vm.read_record(str(venv)) is None


def test_a_pin_that_one_record_cannot_check_is_refused():
    assert vm.parse_pin("Mooncake_Transfer-Engine") == ("mooncake-transfer-engine", None)
    with pytest.raises(ValueError):
        vm.parse_pin("sglang>=0.5")


def test_module_check_record_and_match(venv, tmp_path):
    args = {"venv": str(venv), "pins": PINS}
    rc, res = run_module("sglang_venv_manifest", args, tmp_path)
    assert rc == 0 and res["matches"] is False and res["reasons"] == ["no record of a good install"], res
    rc, res = run_module("sglang_venv_manifest", dict(args, record=True), tmp_path, check=True)
    assert rc == 0 and not (venv / vm.RECORD_NAME).exists(), res
    rc, res = run_module("sglang_venv_manifest", dict(args, record=True), tmp_path)
    assert rc == 0 and res["changed"] is False and res["matches"] is True, res
    assert json.loads((venv / vm.RECORD_NAME).read_text())["installed"] == {"sglang": "0.5.18", "cuda-tile": "1.6.0rc5"}
    rc, res = run_module("sglang_venv_manifest", args, tmp_path)
    assert rc == 0 and res["matches"] is True and res["reasons"] == [], res
    rc, res = run_module("sglang_venv_manifest", {"venv": str(tmp_path / "none"), "pins": PINS}, tmp_path)
    assert rc == 0 and res["matches"] is False and res["installed"] == {}, res
