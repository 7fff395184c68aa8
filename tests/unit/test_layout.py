"""The project's Python reaches its module_utils only through the collection's name (as Ansible ships them to the
hosts), and the old top-level library/ and module_utils/ directories stay gone."""
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
COLL = ROOT / "collections" / "ansible_collections" / "b300" / "rollout"
OURS = sorted(p.stem for p in (COLL / "plugins" / "module_utils").glob("*.py") if p.stem != "__init__")


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
