"""Every repository path quoted in code, messages and docs exists.

A signpost that names a removed file (`roles/sglang_server/...` after the two SGLang roles became one) sends the
reader, or the operator reading an error at 3 a.m., to nothing. This test reads every tracked text file (code,
playbooks, templates, docs; not the recorded fixtures and run logs, which quote paths as they were at the time) and
checks each path that starts with a top-level directory of this repository. Placeholders (`<profile>`, `{{ x }}`,
`*`, `$VAR`) match any name. Not checked: paths on the target hosts (`/opt/...`, `/etc/...`: anything after a `/`),
`../shared/...` (the project's shared folder, absent from a fresh clone) and the few files an operator is told to
create (ALLOWED, each with its reason). No file may point at the absolute path of one machine's checkout: the shared
references are `../shared/...`.

Also here: the NCCL verdict's threshold source names the inventory variables that really set the threshold.
"""
import glob
import pathlib
import re
import subprocess

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOP_DIRS = ("roles", "tools", "docs", "playbooks", "tests", "inventory", "sandbox", "collections", "molecule", "ee")
# a path starts a token: not after a word character, '.', '/', '~', '$' or '-' (../shared/..., /opt/roles/...,
# ~/..., $ROOT/..., foo-tools/...)
PATH_RE = re.compile(r"(?<![\w./~$-])((?:%s)/[\w.+\-/<>{}*$%%\[\]]*)" % "|".join(TOP_DIRS))
PLACEHOLDER_RE = re.compile(r"<[^>/]*>?|\{\{?[^}/]*\}?\}?|\$\{?\w+\}?|\[[^\]/]*\]?|%[sdr]")
# the checkout's absolute location on the machines this project was developed on
MACHINE_PATH_RE = re.compile(r"(?<![\w.])/" + "work/")
TEXT_SUFFIXES = {".py", ".yml", ".yaml", ".md", ".sh", ".j2", ".cfg", ".toml", ".ini", ".txt", ".service", ".conf"}
TEXT_NAMES = {"Makefile", "run", "fw-audit", "README"}
# recorded data: fixtures, device-run logs and the re-run profiles (docs/rerun-raw) quote the paths of the machine
# they came from; option catalogs are SGLang's own help texts; this file quotes missing paths on purpose (examples)
SKIP = ("tests/fixtures/", "tests/unit/test_repo_paths.py", "docs/evidence/**/*.log", "docs/evidence/**/*.json",
        "docs/evidence/**/*.txt", "docs/evidence/**/*.csv", "docs/evidence/**/*.out", "docs/rerun-raw/",
        "roles/*/files/options/")
# paths an operator or a developer is told to create: (path, why it is not in the repository)
ALLOWED = {
    "inventory/production/group_vars/vault.yml": "the operator creates it from vault.yml.example and encrypts it",
    "molecule/my_role/": "molecule/_shared/new-scenario.sh my_role creates it (the README's example name)",
    "collections/ansible_collections/b300/rollout/tests/output": "ansible-test writes it (make sanity); ruff skips it",
}


def _tracked():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return sorted({f for f in out if f and (ROOT / f).is_file()})


def _skipped(rel):
    return any(pathlib.PurePosixPath(rel).match(p) if "*" in p else rel.startswith(p) for p in SKIP)


def _is_text(rel):
    p = pathlib.PurePosixPath(rel)
    return p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES


def text_files():
    return [f for f in _tracked() if _is_text(f) and not _skipped(f)]


def quoted_paths(text):
    """[(line number, path as quoted)] for every repository path in text."""
    out = []
    for ln, line in enumerate(text.splitlines(), 1):
        for m in PATH_RE.finditer(line):
            path = m.group(1).rstrip(".,;:)'\"`]-")
            if "/" in path.rstrip("/"):
                out.append((ln, path))
    return out


def exists(path):
    """The path exists, placeholders matching any name (a glob)."""
    if path in ALLOWED:
        return True
    pattern = PLACEHOLDER_RE.sub("*", path)
    pattern = re.sub(r"\*+", "*", pattern)
    if "*" not in pattern:
        return (ROOT / pattern).exists()
    return bool(glob.glob(str(ROOT / pattern)))


def test_the_scanner_reads_the_tree():
    files = text_files()
    assert "README.md" in files and "tools/argspecs.py" in files and "roles/sglang/tasks/main.yml" in files
    assert not [f for f in files if f.startswith("tests/fixtures/")]
    found = sum(len(quoted_paths((ROOT / f).read_text(errors="replace"))) for f in files)
    assert found > 300, found  # the README alone quotes dozens


def test_every_quoted_repository_path_exists():
    missing = []
    for rel in text_files():
        for ln, path in quoted_paths((ROOT / rel).read_text(errors="replace")):
            if not exists(path):
                missing.append("%s:%d: %s" % (rel, ln, path))
    assert not missing, "repository paths that do not exist (fix the text, or the path):\n" + "\n".join(missing)


def test_no_file_points_at_one_machines_checkout():
    bad = []
    for rel in text_files():
        for ln, line in enumerate((ROOT / rel).read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH_RE.search(line):
                bad.append("%s:%d: %s" % (rel, ln, line.strip()))
    assert not bad, "absolute paths of one machine (use ../shared/... for the shared references):\n" + "\n".join(bad)


@pytest.mark.parametrize("text, expected", [
    ("see roles/sglang/files/profiles/<profile>.yml", ["roles/sglang/files/profiles/<profile>.yml"]),
    ("(expected roles/sglang_server/files/options/server-options-0.5.17.json; known", [
        "roles/sglang_server/files/options/server-options-0.5.17.json"]),
    ("`tools/device/README-*.md`.", ["tools/device/README-*.md"]),
    ('"(expected roles/sglang/files/options/server-options-%s.json; known"', [
        "roles/sglang/files/options/server-options-%s.json"]),
    ("../shared/reference/day-one-facts.md and /opt/sglang/tools/x and $ROOT/tools/y", []),
    ("https://example.invalid/docs/page", []),
])
def test_quoted_paths(text, expected):
    assert [p for _, p in quoted_paths(text)] == expected


def test_exists_with_placeholders_and_without():
    assert exists("roles/sglang/files/profiles/<profile>.yml")
    assert exists("roles/sglang/files/options/server-options-*.json")
    assert exists("roles/{{ role }}/defaults/main.yml")
    assert exists("roles/sglang/files/options/server-options-%s.json")
    assert not exists("roles/sglang_server/files/options/server-options-0.5.17.json")
    assert not exists("roles/sglang_router/files/options/router-options-<ver>.json")
    assert not exists("sandbox/sglang_stub/options/server-options-0.5.17.json")


def test_the_nccl_threshold_source_names_real_variables():
    """An inventory minimum replaces the table's threshold: the verdict says which variables set it."""
    module = (ROOT / "collections/ansible_collections/b300/rollout/plugins/modules/nccl_tests_result.py").read_text()
    defaults = yaml.safe_load((ROOT / "roles/nccl_validation/defaults/main.yml").read_text())
    sources = re.findall(r'"source": "inventory variable \(([^)]*)\)"', module)
    assert sources, "the inventory override's source text moved: update this test"
    names = re.findall(r"\b[a-z][a-z0-9]*_[a-z0-9_]+\b", sources[0])
    assert names and all(n in defaults for n in names), (names, "not in roles/nccl_validation/defaults/main.yml")
    assert {"nccl_validation_min_busbw_gbps", "nccl_validation_multinode_min_busbw_gbps"} <= set(names)
