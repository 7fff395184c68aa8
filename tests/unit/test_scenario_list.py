"""The emulated-hardware scenario list lives in ONE place, sandbox/hwemu/scenarios.py (`ALL`) (issue 16).

Checked here: the scenario table of sandbox/hwemu/README.md names exactly those scenarios; the fixture renderer
describes every synthesized one (it generates tests/fixtures/synth/README.md); and no other document keeps its own
copy of the list (a document naming 6 or more scenarios is a copy: point to scenarios.py instead).
"""
import pathlib
import re
import subprocess

import render_fixtures
import scenarios

ROOT = pathlib.Path(__file__).resolve().parents[2]
HWEMU = ROOT / "sandbox" / "hwemu"

# the documents allowed to enumerate the scenarios: the described table and the generated fixture README
OWNERS = {"sandbox/hwemu/README.md", "tests/fixtures/synth/README.md"}
COPY_THRESHOLD = 6


def readme_table_names():
    text = (HWEMU / "README.md").read_text()
    section = text[text.index("## Scenarios"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    return [m.group(1) for m in re.finditer(r"^\| `([a-z0-9_]+)` \|", section, re.M)]


def test_hwemu_readme_table_is_the_scenario_list():
    names = readme_table_names()
    assert len(names) == len(set(names)), names
    assert set(names) == set(scenarios.ALL), ("README table vs scenarios.ALL: missing %s, extra %s" % (
        sorted(set(scenarios.ALL) - set(names)), sorted(set(names) - set(scenarios.ALL))))


def test_every_synthesized_scenario_is_described_for_the_fixture_readme():
    assert set(render_fixtures.DESCRIPTIONS) == set(scenarios.SCENARIOS)


def test_no_other_document_copies_the_list():
    files = subprocess.run(["git", "ls-files", "*.md", "*.yml", "*.yaml", "*.txt", "*.cfg"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split()
    copies = {}
    for f in files:
        if f in OWNERS or not (ROOT / f).is_file():
            continue
        text = (ROOT / f).read_text(errors="replace")
        named = {n for n in scenarios.ALL if re.search(r"\b%s\b" % re.escape(n), text)}
        if len(named) >= COPY_THRESHOLD:
            copies[f] = sorted(named)
    assert not copies, "these documents keep their own scenario list (point to sandbox/hwemu/scenarios.py): %s" % copies
