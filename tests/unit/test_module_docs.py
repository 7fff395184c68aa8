"""Every module's DOCUMENTATION, EXAMPLES and RETURN are valid YAML with what ansible-doc needs.

`ansible-test sanity` (validate-modules, yamllint) checks this too, but only in the sanity part and only after the
tools are installed; this reads the three strings straight from the source (no import) in well under a second, so a
doc string broken by an edit fails `make unit` on a laptop. Once a ': ' in a plain RETURN description failed CI.
"""
import ast
import pathlib

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = sorted((ROOT / "collections/ansible_collections/b300/rollout/plugins/modules").glob("*.py"))


def _doc_strings(path):
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                out[name] = node.value.value
    return out


def _undescribed(options, where):
    bad = []
    for key, spec in (options or {}).items():
        if not isinstance(spec, dict) or not spec.get("description"):
            bad.append("%s.%s" % (where, key))
            continue
        bad += _undescribed(spec.get("suboptions") or spec.get("contains"), "%s.%s" % (where, key))
    return bad


def test_there_are_modules():
    assert len(MODULES) >= 10, MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_module_doc_strings_are_valid_yaml_and_describe_everything(path):
    docs = _doc_strings(path)
    assert set(docs) == {"DOCUMENTATION", "EXAMPLES", "RETURN"}, "%s: missing %s" % (
        path.name, {"DOCUMENTATION", "EXAMPLES", "RETURN"} - set(docs))
    parsed = {}
    for name, text in docs.items():
        try:
            parsed[name] = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            pytest.fail("%s: %s is not valid YAML: %s" % (path.name, name, exc))
    doc = parsed["DOCUMENTATION"]
    assert doc["module"] == path.stem
    assert doc.get("short_description") and doc.get("description")
    assert "ansible.builtin.action_common_attributes" in (doc.get("extends_documentation_fragment") or [])
    assert {"check_mode", "diff_mode", "platform"} <= set(doc.get("attributes") or {}), path.name
    assert _undescribed(doc.get("options"), "options") == []
    assert isinstance(parsed["EXAMPLES"], list) and parsed["EXAMPLES"], "%s: EXAMPLES has no task" % path.name
    ret = parsed["RETURN"]
    assert isinstance(ret, dict) and ret, "%s: RETURN documents nothing" % path.name
    assert _undescribed(ret, "RETURN") == []
    for key, spec in ret.items():
        assert spec.get("returned") and spec.get("type"), "%s: RETURN.%s lacks returned/type" % (path.name, key)


def test_a_broken_return_is_caught(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text('DOCUMENTATION = """\nmodule: broken\n"""\nEXAMPLES = "- x: 1"\n'
                   'RETURN = """\nreport:\n  description: the report and C(rules): every rule\n"""\n')
    with pytest.raises(yaml.YAMLError):
        yaml.safe_load(_doc_strings(bad)["RETURN"])
