#!/usr/bin/env python3
"""Move the collection's module_utils into wings that match the products (issue 39 point 5), and rewrite every
reference in the repository: Python imports (`...plugins.module_utils.NAME`, `...plugins.module_utils import NAME`),
paths in text (`module_utils/NAME.py`, `module_utils/NAME.function`, `module_utils/*.py`), path expressions in tests
(`MU / "NAME.py"`, `"module_utils" / "NAME.py"`), and the few places that build the directory by parts (the
host-side scripts that find their flat copies in a checkout, the roles that copy files to the hosts).

Re-runnable: a file already in its wing is left alone, a reference already rewritten is not matched again, so the
lead runs it again after merging a branch that added or edited module_utils files or references:

    tools/module_utils_wings.py            # move (git mv) and rewrite; prints what it did
    tools/module_utils_wings.py --check    # exit 1 when a file is not in its wing or a reference is stale

A module_utils file at the top level that WINGS does not name stops the run (say in WINGS which wing it joins).
tests/unit/test_house.py checks the import graph: a wing imports only its own files, `common`, and the wings
listed below it in LOWER."""
import argparse
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
MU = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins" / "module_utils"

# wing -> (its files, the one paragraph of its __init__.py)
WINGS = {
    "common": (["md_table", "host_lock", "input_rules"],
               "What every product shares and that imports nothing of the collection: the Markdown table writer of "
               "the reports (md_table), the host-wide lock a run takes (host_lock), and the value rules every input "
               "is checked with before anything runs (input_rules)."),
    "hw": (["affinity", "gpu_topology", "rdma_nic", "fw_matrix", "tools"],
           "The hardware as the facts modules read it: GPU topology and NUMA affinity (gpu_topology, affinity), the "
           "RDMA NICs (rdma_nic), the firmware matrix that judges a NIC's firmware against its driver (fw_matrix: "
           "here because the facts read the driver version with it, and the gate, the update and the triage judge "
           "with it), and the tool runner and fact builders the modules share (tools)."),
    "firmware": (["fw_update", "fw_update_run", "fw_check_run"],
                 "The ConnectX firmware products: the update's decisions and report (fw_update), its engine that runs "
                 "flint and mlxfwreset (fw_update_run), and the gate/audit check's engine (fw_check_run). The matrix "
                 "they judge with is hw/fw_matrix.py."),
    "hoststack": (["host_stack", "host_stack_io"],
                  "The host stack stage (driver, CUDA, DOCA-OFED, fabric manager packages): its checks and plan "
                  "(host_stack) and what it reads from a host (host_stack_io)."),
    "health": (["thermal", "health_history", "nccl_results"],
               "GPU health over time and under load: the thermal soak's verdict (thermal), the health history's "
               "format and window reader (health_history; the sampler on each host imports both files flat, next to "
               "it), and the NCCL tests' results and verdict (nccl_results)."),
    "weights": (["model_weights", "model_weights_io", "model_weights_stage"],
                "The model weights stage: its decisions on manifests and directories (model_weights), the file system "
                "and HTTP work (model_weights_io), and the engine of the model_weights_stage module (model_weights_stage)."),
    "sglang": (["sglang_plan", "sglang_rollout", "sglang_checks", "sglang_metrics", "argparse_abbrev", "wheelhouse",
                "host_files", "venv_manifest"],
               "SGLang serving: the deployment plan (sglang_plan, with the argparse abbreviation rules it checks flags "
               "by: argparse_abbrev), the rollout's ordering and rollback decisions (sglang_rollout), the checks the "
               "role's filters call (sglang_checks), the one /metrics reader (sglang_metrics; the acceptance client "
               "imports it flat), the wheelhouse manifest (wheelhouse), the host's files compared and written in one "
               "module run (host_files) and the venv record that skips no-op pip runs (venv_manifest)."),
    "triage": (["triage_collect", "triage_counters", "triage_evidence", "triage_gpu", "triage_kmsg", "triage_pcie",
                "triage_traffic", "triage_verdict"],
               "The on-call triage: what it collects on a host (triage_collect and its readers triage_counters, "
               "triage_gpu, triage_kmsg, triage_pcie, triage_traffic), pasted evidence (triage_evidence), and the "
               "verdict and report (triage_verdict)."),
    "verdicts": (["acceptance", "quality_gate", "sweep"],
                 "The go-live verdicts: the acceptance run's verdict and report (acceptance), the answer-quality gate "
                 "(quality_gate), and the concurrency sweep's knee (sweep)."),
}
# wing -> the wings it may import besides itself (common is always allowed); nothing imports upward
LOWER = {
    "common": [],
    "hw": [],
    "firmware": ["hw"],
    "hoststack": ["hw"],
    "health": [],
    "weights": [],
    "sglang": ["hw"],
    "triage": ["hw"],
    "verdicts": ["sglang"],
}
WING_OF = {name: wing for wing, (names, _doc) in WINGS.items() for name in names}
PKG = "ansible_collections.b300.rollout.plugins.module_utils"
# the places that build the module_utils directory by parts (a checkout's fallback of a host-side script, a role's
# copy source): (file, text before, text after); applied once (the after text is not matched again)
BY_PARTS = [
    ("roles/health_history/files/sampler.py", '"plugins", "module_utils"))', '"plugins", "module_utils", "health"))'),
    ("roles/acceptance/files/acceptance_client.py", '"plugins", "module_utils")):', '"plugins", "module_utils", "sglang")):'),
    ("roles/health_history/tasks/install.yml", 'rollout/plugins/module_utils"', 'rollout/plugins/module_utils/health"'),
]
# this script and the test of its rules hold old-style references on purpose
NOT_REWRITTEN = {pathlib.Path(__file__).resolve(), ROOT / "tests" / "unit" / "test_house.py"}
TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".j2", ".txt", ".cfg", ".toml", ".ini", ".sh", ".json", ""}


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode()
    return [ROOT / p for p in out.split("\0") if p]


def move_files(check):
    """git mv each top-level module_utils file into its wing; a file WINGS does not name stops the run."""
    loose = sorted(p.stem for p in MU.glob("*.py") if p.stem != "__init__")
    unknown = [n for n in loose if n not in WING_OF]
    if unknown:
        sys.exit("module_utils files that WINGS does not place (add each to its wing in %s): %s" % (
            pathlib.Path(__file__).name, ", ".join(unknown)))
    if check:
        return loose
    for wing, (_names, doc) in WINGS.items():
        d = MU / wing
        d.mkdir(exist_ok=True)
        init = d / "__init__.py"
        text = '"""%s"""\n' % _wrap(doc)
        if not init.exists() or init.read_text() != text:
            init.write_text(text)
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
    for name in loose:
        subprocess.run(["git", "mv", str(MU / (name + ".py")), str(MU / WING_OF[name] / (name + ".py"))], cwd=ROOT,
                       check=True)
    return loose


def _wrap(doc, width=116):
    words, lines, line = doc.split(), [], ""
    for w in words:
        if line and len(line) + 1 + len(w) > width:
            lines.append(line)
            line = w
        else:
            line = (line + " " + w) if line else w
    lines.append(line)
    return "\n".join(lines)


NAMES = "|".join(sorted(WING_OF, key=len, reverse=True))
DOTTED = re.compile(r"(plugins\.module_utils)\.(%s)\b" % NAMES)
FROM_IMPORT = re.compile(r"^(?P<indent>[ \t]*[\"']?)from ansible_collections\.b300\.rollout\.plugins\.module_utils import "
                         r"(?P<names>[^(\n#\\\"']+?)(?P<comment>\\n[\"']|[ \t]*#.*)?$", re.M)   # a line, or a line in a string
GLOB = re.compile(r"(plugins/module_utils/)\*\.py")
SLASHED = re.compile(r"(module_utils/)(%s)\b" % NAMES)
PATH_EXPR = re.compile(r'((?:\bMU|"module_utils")\s*/\s*)"(%s)\.py"' % NAMES)


def _from_import(m):
    items = [x.strip() for x in m.group("names").split(",") if x.strip()]
    if not all(it.split()[0] in WING_OF for it in items):
        return m.group(0)
    by_wing = {}
    for it in items:
        by_wing.setdefault(WING_OF[it.split()[0]], []).append(it)
    if len(by_wing) > 1 and m.group("indent").strip():
        return m.group(0)   # a string that imports from two wings: one line of a child's script, left for a person
    lines = ["%sfrom %s.%s import %s" % (m.group("indent"), PKG, wing, ", ".join(its)) for wing, its in by_wing.items()]
    lines[-1] += m.group("comment") or ""
    return "\n".join(lines)


def _dotted(text):
    """plugins.module_utils.NAME -> plugins.module_utils.WING.NAME, line by line: the continuation lines of an
    `import (a,` that was made longer move right as far (pep8 E128, visual indent)."""
    out, shift, depth = [], 0, 0
    for line in text.split("\n"):
        if depth > 0:
            out.append(" " * shift + line if shift and line.strip() else line)
            depth += line.count("(") - line.count(")")
            continue
        new = DOTTED.sub(lambda m: "%s.%s.%s" % (m.group(1), WING_OF[m.group(2)], m.group(2)), line)
        shift = len(new) - len(line)
        depth = new.count("(") - new.count(")") if " import (" in new and not new.rstrip().endswith("(") else 0
        out.append(new)
    return "\n".join(out)


def rewrite(text):
    text = FROM_IMPORT.sub(_from_import, text)
    text = _dotted(text)
    text = SLASHED.sub(lambda m: "%s%s/%s" % (m.group(1), WING_OF[m.group(2)], m.group(2)), text)
    text = GLOB.sub(r"\1*/*.py", text)
    text = PATH_EXPR.sub(lambda m: '%s"%s" / "%s.py"' % (m.group(1), WING_OF[m.group(2)], m.group(2)), text)
    return text


def rewrite_references(check):
    changed = []
    for path in tracked_files():
        if path.suffix not in TEXT_SUFFIXES or not path.is_file() or path.is_symlink() or path in NOT_REWRITTEN:
            continue
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        new = rewrite(text)
        rel = str(path.relative_to(ROOT))
        for f, before, after in BY_PARTS:
            if rel == f and before in new:
                new = new.replace(before, after)
        if new != text:
            changed.append(rel)
            if not check:
                path.write_text(new)
    return changed


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when something is not in its wing")
    a = ap.parse_args(argv)
    moved = move_files(a.check)
    changed = rewrite_references(a.check)
    print("%s %d files into wings: %s" % ("would move" if a.check else "moved", len(moved), ", ".join(moved) or "-"))
    print("%s references in %d files%s" % ("stale" if a.check else "rewrote", len(changed),
                                           (": " + ", ".join(changed)) if changed else ""))
    return 1 if a.check and (moved or changed) else 0


if __name__ == "__main__":
    sys.exit(main())
