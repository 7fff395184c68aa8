"""The project's Python reaches its module_utils only through the collection's name (as Ansible ships them to the
hosts), and the old top-level library/ and module_utils/ directories stay gone."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLL = ROOT / "collections" / "ansible_collections" / "b300" / "rollout"
OURS = sorted(p.stem for p in (COLL / "plugins" / "module_utils").rglob("*.py") if p.stem != "__init__")


def test_collection_layout():
    assert {"gpu_topology", "rdma_nic", "fw_matrix", "sglang_plan"} <= set(OURS)
    assert not (ROOT / "library").exists() and not (ROOT / "module_utils").exists()
    assert (COLL / "galaxy.yml").exists() and (COLL / "meta" / "runtime.yml").exists()


def test_no_import_of_ours_through_ansible_module_utils():
    pat = re.compile(r"(from|import)\s+ansible\.module_utils(\.(%s)\b|\s+import\s+.*\b(%s)\b)"
                     % ("|".join(OURS), "|".join(OURS)))
    bad = []
    for d in ("collections", "tests", "tools", "sandbox", "roles"):
        for p in (ROOT / d).rglob("*.py"):
            for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
                if pat.search(line):
                    bad.append("%s:%d: %s" % (p.relative_to(ROOT), i, line.strip()))
    assert not bad, "import these as ansible_collections.b300.rollout.plugins.module_utils.<name>:\n" + "\n".join(bad)


def test_no_text_sends_a_reader_to_the_old_library():
    """The modules moved from library/ into the collection (plugins/modules/); a docstring or comment naming
    library/<module>.py sends the reader to a file that is gone (tools/bench/library/ is a real, other directory)."""
    import subprocess
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    stale = re.compile(r"(?<![\w/.-])library/(\w+)\.py")
    bad = []
    for f in files:
        if f.startswith(("tests/fixtures/", "docs/rerun-raw/", "docs/evidence/")) or f == "tests/unit/test_layout.py" \
                or not (ROOT / f).is_file():
            continue
        try:
            text = (ROOT / f).read_text()
        except UnicodeDecodeError:
            continue
        bad += ["%s: library/%s.py" % (f, m.group(1)) for m in stale.finditer(text)
                if not (ROOT / "library" / (m.group(1) + ".py")).exists()]
    assert not bad, "name the collection's plugins/modules/<name>.py instead:\n" + "\n".join(bad)
    assert stale.search("Used by library/nccl_tests_result.py.") and not stale.search("tools/bench/" + "library/x.py")
