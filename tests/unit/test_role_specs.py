"""Every role's meta/argument_specs.yml is generated from its defaults/main.yml (tools/argspecs.py) and stays so:
each default has a spec with the same default and a description that says more than the variable's name."""
import pathlib
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tools"))
import argspecs

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").exists())


def test_every_role_is_covered():
    assert {"sglang", "hw_facts", "gpu_health_gate", "nic_firmware_gate", "nccl_validation", "thermal_soak"} <= set(ROLES)
    assert not (ROOT / "roles" / "sglang_server").exists() and not (ROOT / "roles" / "sglang_router").exists()


@pytest.mark.parametrize("role", ROLES)
def test_specs_match_defaults(role):
    d = ROOT / "roles" / role
    defaults = yaml.safe_load((d / "defaults" / "main.yml").read_text()) or {}
    specs = yaml.safe_load((d / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    main = specs["main"]["options"]
    assert set(defaults) <= set(main), sorted(set(defaults) - set(main))
    for name, value in defaults.items():
        opt = main[name]
        if not (isinstance(value, str) and "{{" in value):
            assert opt.get("default") == value, name
        desc = opt.get("description")
        desc = " ".join(desc) if isinstance(desc, list) else (desc or "")
        assert len(desc.split()) >= 3 and desc.strip() != name, "%s: %s has no real description" % (role, name)
    # every entry point validates the same options
    for ep, spec in specs.items():
        assert spec["options"] == main, (role, ep)
    assert (d / "meta" / "argument_specs.yml").read_text() == argspecs.render(argspecs.generate(d)), \
        "%s: run tools/argspecs.py --write %s" % (role, role)


def test_sglang_entry_points():
    specs = yaml.safe_load((ROOT / "roles" / "sglang" / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert set(specs) == {"main", "50_router", "12_preflight_plan", "60_rolling_pass", "62_rolling_drain", "41_start_wait_one"}
    for ep in specs:
        assert (ROOT / "roles" / "sglang" / "tasks" / ("%s.yml" % ep)).exists(), ep


def test_generator_refuses_an_undocumented_default(tmp_path):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults" / "main.yml").write_text("---\n# Seconds to wait.\ndemo_wait_s: 3\ndemo_other: x\n")
    with pytest.raises(argspecs.SpecError, match="demo_other has no comment"):
        argspecs.generate(role)


def test_generator_documents_commented_example_as_optional(tmp_path):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults" / "main.yml").write_text(
        "---\n# Seconds to wait for it.\ndemo_wait_s: 3\n# Address peers use to reach this host.\n# demo_addr: 10.0.0.1\n")
    spec = argspecs.generate(role)
    assert spec["options"]["demo_addr"] == {"type": "str", "description": "Address peers use to reach this host."}
    assert spec["options"]["demo_wait_s"]["default"] == 3


def test_check_mode_cli_passes_on_the_tree():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "argspecs.py"), "--all"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
