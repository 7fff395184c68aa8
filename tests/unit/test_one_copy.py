"""One copy of each shared thing (issue 16 item 4): the SGLang option catalogs live in roles/sglang/files/options
only, and argparse's prefix rule in module_utils/sglang/argparse_abbrev.py only (the argv check, which runs alone through
ansible.builtin.script, carries an exact copy between markers)."""
import pathlib
import re
import subprocess
import sys

from ansible_collections.b300.rollout.plugins.module_utils.sglang import argparse_abbrev as ab

ROOT = pathlib.Path(__file__).resolve().parents[2]
MU = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins" / "module_utils"


def test_prefix_rule():
    opts = {"--tp-size": 1, "--dp-size": 1, "--disable-radix-cache": 1, "--disable-cuda-graph": 1, "--port": 1}
    assert ab.abbreviations(["--tp", "4", "--dp=1", "--port", "1", "--disable", "--", "--tp"], opts) == [
        {"used": "--tp", "long": "--tp-size"}, {"used": "--dp", "long": "--dp-size"}]
    assert ab.long_names(["--tp=4", "--dp", "1", "--disable", "x"], opts) == ["--tp-size=4", "--dp-size", "1", "--disable", "x"]
    assert ab.prefix_matches("--disable", opts) == ["--disable-cuda-graph", "--disable-radix-cache"]


def test_argv_check_carries_an_exact_copy_of_the_rule():
    text = (ROOT / "roles" / "sglang" / "files" / "sglang_argv_check.py").read_text()
    m = re.search(r"# --- begin argparse_abbrev[^\n]*\n#[^\n]*\n(.*?)# --- end argparse_abbrev", text, re.S)
    assert m, "marker block missing in sglang_argv_check.py"
    src = (MU / "sglang" / "argparse_abbrev.py").read_text()
    assert m.group(1) == src[src.index("def prefix_matches"):].rstrip() + "\n"


def test_no_other_copy_of_the_prefix_rule():
    pat = re.compile(r"\bo\.startswith\((name|flag)\)|\bf\.startswith\(flag\)")
    hits = []
    for d in ("collections", "tools", "sandbox", "roles"):
        for p in (ROOT / d).rglob("*.py"):
            if p.name in ("argparse_abbrev.py", "sglang_argv_check.py"):
                continue
            hits += ["%s:%d" % (p.relative_to(ROOT), i) for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
                     if pat.search(line)]
    assert not hits, hits


def test_one_copy_of_the_option_catalogs():
    assert not (ROOT / "sandbox" / "sglang_stub" / "options").exists()
    assert sorted(p.name for p in (ROOT / "roles" / "sglang" / "files" / "options").glob("server-options-*.json"))


def test_fleet_ships_catalogs_and_rule_next_to_the_stub(tmp_path):
    """The tar fleet.sh pipes into /opt/sglang-stub holds the stub, options/ and argparse_abbrev.py."""
    script = ('ROOT=%s; source <(sed -n "/^tree_files()/,/^}/p;/^STUB_ABBREV=/,/^}/p" sandbox/fleet.sh); cd "$ROOT"; '
              'stub_files | tar -C "$ROOT" -T - -cf - --transform "s|^sandbox/sglang_stub/||" '
              '--transform "s|^roles/sglang/files/options/|options/|" --transform "s|^$STUB_ABBREV\\$|argparse_abbrev.py|" '
              '| tar -tf -') % ROOT
    names = set(subprocess.run(["bash", "-c", script], cwd=str(ROOT), capture_output=True, text=True, check=True).stdout.split())
    assert {"sglang_stub.py", "bin/sglang", "argparse_abbrev.py", "options/server-options-0.5.17.json",
            "options/server-options-0.5.18.json"} <= names, names
    # and the stub, run from the shipped layout (no repository around it), finds both
    dest = tmp_path / "opt"
    dest.mkdir()
    subprocess.run(["bash", "-c", script.replace("| tar -tf -", "| tar -C %s -xf -" % dest)], cwd=str(ROOT), check=True)
    out = subprocess.run([sys.executable, "-c", "import sglang_stub as s; print(s.OPTIONS_DIR, s.argparse_abbrev.__file__)"],
                         cwd=str(dest), capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(dest / "options"), str(dest / "argparse_abbrev.py")]
