"""Every role's meta/argument_specs.yml is generated from its defaults/main.yml (tools/argspecs.py) and stays so:
each default has a spec with the same default and a description that says more than the variable's name; each entry
point says what it does (no "<role> role" placeholder) and the role's description is its defaults' head comment.
Every role's README.md is generated from that spec and stays so (a new role without one fails here)."""
import pathlib
import subprocess
import sys

import pytest
import yaml

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
    # issue 39: the cross-role calls (roles/nic_firmware_update, playbooks/rolling_restart.yml, the host stack) go
    # through these names, never through a numbered file
    assert set(specs) == {"main", "router", "plan", "rolling_pass", "take_out", "drain", "start_and_wait", "put_back",
                          "restart"}
    for ep in specs:
        text = (ROOT / "roles" / "sglang" / "tasks" / ("%s.yml" % ep)).read_text()
        # each entry point's file says so in its head comment (main lists the others)
        assert ep == "main" or ("# entry point %s:" % ep) in text, ep


@pytest.mark.parametrize("role", ROLES)
def test_readme_matches_spec(role):
    d = ROOT / "roles" / role
    readme = d / "README.md"
    assert readme.exists(), "roles/%s has no README.md: run tools/argspecs.py --write %s" % (role, role)
    assert readme.read_text() == argspecs.render_readme(d), \
        "roles/%s/README.md drifted from meta/argument_specs.yml: run tools/argspecs.py --write %s" % (role, role)


@pytest.mark.parametrize("role", ROLES)
def test_every_entry_point_says_what_it_does(role):
    specs = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    shorts = [spec["short_description"] for spec in specs.values()]
    assert len(set(shorts)) == len(shorts), (role, shorts)   # one text copied onto every entry point says nothing
    for ep, spec in specs.items():
        short = spec["short_description"]
        assert len(short.split()) >= 5 and short != "%s role" % role and "(entry point" not in short, (role, ep, short)
        assert spec.get("description"), (role, ep)


HEAD = "---\n# entry point main: Wait for the demo to be ready, then stop.\n# The demo role: what it is for.\n\n"


def _role(tmp_path, defaults, meta=None):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults" / "main.yml").write_text(defaults)
    if meta:
        (role / "meta").mkdir()
        (role / "meta" / "main.yml").write_text(meta)
    return role


def test_entry_points_and_head_come_from_the_defaults(tmp_path):
    role = _role(tmp_path, "---\n# entry point main: Deploy the demo service and wait for it.\n"
                 "# The demo role: a service.\n# Why: a test.\n#\n# Second paragraph.\n"
                 "# entry point stop: Stop the demo service | and <nothing> else.\n\n"
                 "# Seconds to wait.\ndemo_wait_s: 3\n# The user, e.g. `{{ demo_wait_s }}`.\ndemo_user: \"{{ 'x' }}\"\n")
    spec = argspecs.generate(role)
    assert spec["entry_points"] == {"main": "Deploy the demo service and wait for it.",
                                    "stop": "Stop the demo service | and <nothing> else."}
    assert spec["description"] == ["The demo role: a service. Why: a test.", "Second paragraph."]
    (role / "meta").mkdir()
    (role / "meta" / "argument_specs.yml").write_text(argspecs.render(spec))
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert specs["stop"]["short_description"] == "Stop the demo service | and <nothing> else."
    assert specs["stop"]["description"] == specs["main"]["description"] == spec["description"]
    readme = argspecs.render_readme(role)
    assert "| `stop` | Stop the demo service \\| and \\<nothing> else. |" in readme
    assert "| `demo_wait_s` | int | `3` | Seconds to wait. |" in readme
    assert "| `demo_user` | str | computed: `{{ 'x' }}` | The user, e.g. `{{ demo_wait_s }}`. |" in readme
    assert "\nSecond paragraph.\n" in readme


def test_generator_refuses_a_role_that_does_not_say_what_it_does(tmp_path):
    with pytest.raises(argspecs.SpecError, match="no '# entry point main: what it does' line"):
        argspecs.generate(_role(tmp_path, "---\n# The demo role: a service.\n\n# Seconds to wait.\ndemo_wait_s: 3\n"))


def test_generator_refuses_the_old_entry_points_list(tmp_path):
    with pytest.raises(argspecs.SpecError, match="one '# entry point NAME: what it does' line per entry point"):
        argspecs.generate(_role(tmp_path, HEAD.replace("# The demo role", "# entry points: stop\n# The demo role")
                                + "# Seconds to wait.\ndemo_wait_s: 3\n"))


def test_readme_shows_the_galaxy_description_and_every_default(tmp_path):
    role = _role(tmp_path, HEAD + "# Rows, each {a, b}.\ndemo_rows: [{a: 1, b: x}]\n# A path.\n# demo_path: /x\n",
                 meta="---\ngalaxy_info:\n  description: The demo, as Galaxy shows it\n")
    (role / "meta" / "argument_specs.yml").write_text(argspecs.render(argspecs.generate(role)))
    readme = argspecs.render_readme(role)
    assert readme.startswith("# roles/" + "demo\n") and "\n**The demo, as Galaxy shows it**\n" in readme
    assert "| `demo_rows` | list of dict | `[{a: 1, b: x}]` | Rows, each {a, b}. |" in readme
    assert "| `demo_path` | str | none (optional) | A path. |" in readme


def test_check_mode_cli_finds_a_drifted_readme(tmp_path, monkeypatch, capsys):
    role = _role(tmp_path, HEAD + "# Seconds to wait.\ndemo_wait_s: 3\n")
    (role.parent / "roles").mkdir()
    moved = role.rename(role.parent / "roles" / "demo")
    monkeypatch.setattr(argspecs, "ROOT", tmp_path)
    assert argspecs.main(["--write", "demo"]) == 0 and argspecs.main(["demo"]) == 0
    (moved / "README.md").write_text((moved / "README.md").read_text().replace("Seconds to wait", "Minutes to wait"))
    assert argspecs.main(["demo"]) == 1
    assert "demo: README.md is out of date: run tools/argspecs.py --write demo" in capsys.readouterr().out


def test_generator_refuses_an_undocumented_default(tmp_path):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults" / "main.yml").write_text(HEAD + "# Seconds to wait.\ndemo_wait_s: 3\ndemo_other: x\n")
    with pytest.raises(argspecs.SpecError, match="demo_other has no comment"):
        argspecs.generate(role)


def test_generator_documents_commented_example_as_optional(tmp_path):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    (role / "defaults" / "main.yml").write_text(
        HEAD + "# Seconds to wait for it.\ndemo_wait_s: 3\n# Address peers use to reach this host.\n# demo_addr: 10.0.0.1\n")
    spec = argspecs.generate(role)
    assert spec["options"]["demo_addr"] == {"type": "str", "description": "Address peers use to reach this host."}
    assert spec["options"]["demo_wait_s"]["default"] == 3


def test_check_mode_cli_passes_on_the_tree():
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "argspecs.py"), "--all"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
