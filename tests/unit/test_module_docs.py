"""Every module's DOCUMENTATION, EXAMPLES and RETURN are valid YAML with what ansible-doc needs.

`ansible-test sanity` (validate-modules, yamllint) checks this too, but only in the sanity part and only after the
tools are installed; this reads the three strings straight from the source (no import) in well under a second, so a
doc string broken by an edit fails `make unit` on a laptop. Once a ': ' in a plain RETURN description failed CI.
"""
import ast
import pathlib
import re

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLL = ROOT / "collections/ansible_collections/b300/rollout"
MODULES = sorted((COLL / "plugins/modules").glob("*.py"))
FRAGMENTS = {"b300.rollout." + p.stem: p for p in sorted((COLL / "plugins/doc_fragments").glob("*.py"))}


def _doc_strings(path):
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("DOCUMENTATION", "EXAMPLES", "RETURN") and isinstance(node.value, ast.Constant):
                out[name] = node.value.value
    return out


def _fragment(name):
    """The DOCUMENTATION of one of the collection's doc fragments (class ModuleDocFragment), parsed."""
    tree = ast.parse(FRAGMENTS[name].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and node.targets[0].id == "DOCUMENTATION":
            return yaml.safe_load(node.value.value)
    raise AssertionError("%s has no DOCUMENTATION" % name)


def _with_fragments(doc):
    """doc as ansible-doc shows it: the collection's fragments merged in (the module's own entries win)."""
    doc = dict(doc)
    for name in doc.get("extends_documentation_fragment") or []:
        if name.startswith("b300.rollout."):
            frag = _fragment(name)
            for key, value in frag.items():
                if isinstance(value, dict):
                    doc[key] = dict(value, **(doc.get(key) or {}))
                else:
                    doc.setdefault(key, value)
    return doc


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
    doc = _with_fragments(parsed["DOCUMENTATION"])
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


# --- signposts of the collection (issue 31 part 3): the hw group, the fragments, the CHANGELOG, the README -----------
def _docs(path):
    return yaml.safe_load(_doc_strings(path)["DOCUMENTATION"])


def _argspec_options(path):
    """Top-level option names of the module's AnsibleModule(argument_spec=dict(...)), hw_argument_spec() expanded."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "argument_spec" and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys}
        if isinstance(node, ast.keyword) and node.arg == "argument_spec" and isinstance(node.value, ast.Call):
            names = {kw.arg for kw in node.value.keywords}
            if any(isinstance(a, ast.Call) and getattr(a.func, "id", "") == "hw_argument_spec" for a in node.value.args):
                names |= {"bin_path", "sysfs_root"}
            return names
    raise AssertionError("%s: no argument_spec=dict(...)" % path.name)


def test_the_hw_group_is_exactly_the_modules_that_take_both_hardware_paths():
    """module_defaults for group/b300.rollout.hw gives bin_path AND sysfs_root to every module of the group: a module
    without one of them would refuse it, a module with both outside the group would silently read /sys."""
    runtime = yaml.safe_load((COLL / "meta/runtime.yml").read_text())
    group = set(runtime["action_groups"]["hw"])
    both = {p.stem for p in MODULES if {"bin_path", "sysfs_root"} <= _argspec_options(p)}
    fragment = {p.stem for p in MODULES if "b300.rollout.hw" in (_docs(p).get("extends_documentation_fragment") or [])}
    assert group == both == fragment, {"group": sorted(group), "take both": sorted(both), "fragment": sorted(fragment)}
    for p in MODULES:
        own = _docs(p).get("options") or {}
        if p.stem in fragment:
            assert not {"bin_path", "sysfs_root"} & set(own), "%s: documents the fragment's options again" % p.name


def test_the_attributes_fragment_is_not_repeated():
    usual = _fragment("b300.rollout.common")["attributes"]
    for p in MODULES:
        doc = _docs(p)
        assert "author" not in doc, "%s: the author is the fragment's" % p.name
        assert "b300.rollout.common" in doc["extends_documentation_fragment"], p.name
        for key, value in (doc.get("attributes") or {}).items():
            assert usual.get(key) != value, "%s: attributes.%s repeats the fragment" % (p.name, key)


def _changelog_sections():
    """{version: text} of the collection's CHANGELOG.md."""
    text = (COLL / "CHANGELOG.md").read_text()
    parts = re.split(r"^## (\d+\.\d+\.\d+)\b.*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _version_key(v):
    return tuple(int(x) for x in v.split("."))


def test_the_changelog_names_every_module_and_filter_in_the_release_that_added_it():
    sections = _changelog_sections()
    galaxy = yaml.safe_load((COLL / "galaxy.yml").read_text())
    assert max(sections, key=_version_key) == str(galaxy["version"]), "galaxy.yml version has no CHANGELOG section"
    for p in MODULES:
        added = str(_docs(p)["version_added"])
        mentioned = sorted((v for v, t in sections.items() if re.search(r"\b%s\b" % p.stem, t)), key=_version_key)
        assert mentioned, "CHANGELOG.md does not name the module %s" % p.stem
        assert mentioned[0] == added, "%s: version_added %s, first named in the CHANGELOG under %s" % (
            p.stem, added, mentioned[0])
    src = (COLL / "plugins/filter/sglang_plan.py").read_text()
    filters = re.findall(r"[\"'](sglang_plan_\w+)[\"']\s*:", src)
    assert filters and all(any(f in t for t in sections.values()) for f in filters), filters


def test_the_collection_readme_lists_every_module():
    readme = (COLL / "README.md").read_text()
    missing = [p.stem for p in MODULES if "`%s`" % p.stem not in readme]
    assert not missing, "the collection README lacks %s" % missing
