"""tools/test-parts.sh's closing table (issue 40: the CI time and what bounds it): a failing part is named, and the
machine's busy CPU and the floor it sets are printed. Runs the script with a part make does not know (fails at once)."""
import os
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_failed_part_named_and_machine_floor_printed(tmp_path):
    out = tmp_path / "times.txt"
    r = subprocess.run(["bash", str(ROOT / "tools" / "test-parts.sh"), "no-such-part", "lint"], cwd=ROOT,
                       env=dict(os.environ, B300_TEST_TIMES=str(out)), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout
    table = out.read_text()
    assert re.search(r"^  no-such-part +\d+ s  cpu +\d+ s  FAILED$", table, re.M), table
    assert re.search(r"^  lint +- +not run$", table, re.M), table          # the parts after a failure do not run
    assert re.search(r"^  total .*FAILED in no-such-part$", table, re.M), table
    m = re.search(r"machine busy (\d+) CPU-s over (\d+) s on (\d+) cores: floor (\d+) s", table)
    assert m, table
    busy, _, cores, floor = map(int, m.groups())
    assert cores == os.cpu_count() and floor == busy // cores, table
    assert "foreground parts done at" in table
