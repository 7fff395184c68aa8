"""No pin that nothing uses (issue 16): every collection of requirements.yml and every package of requirements.txt
is used by a tracked file of the project (a module/plugin reference, an import, or the command that runs it)."""
import pathlib
import re
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
# requirements.txt name -> a string whose presence in a tracked file (other than the requirements files) is a use
PY_USES = {
    "ansible-core": "ansible-playbook",
    "ansible-runner": "import ansible_runner",
    "paramiko": "-c paramiko",
    "mitogen": "import ansible_mitogen",     # the opt-in strategy plugin b300.rollout.mitogen_linear
    "jinja2": ".j2",                       # templates rendered by ansible.builtin.template
    "pyyaml": "import yaml",
    "molecule": "molecule test",
    "molecule-plugins": "name: podman",    # molecule/*/molecule.yml driver
    "ansible-lint": "ansible-lint",
    "yamllint": "yamllint",
    "ruff": "ruff check",
    "pytest": "import pytest",
    "pytest-xdist": "pytest -q -n auto",   # make unit on every core
    "matplotlib": "import matplotlib",
    "rouge-score": "from rouge_score import",
    "ansible-builder": "ansible-builder",
}


def tracked_text():
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    out = {}
    for f in files:
        if f in ("requirements.txt", "requirements.yml") or f.startswith(("sandbox/hwemu/real/", "tests/fixtures/")):
            continue
        p = ROOT / f
        if p.is_file() and p.stat().st_size < 2_000_000:
            try:
                out[f] = p.read_text()
            except UnicodeDecodeError:
                pass
    # template files count as uses of jinja2 by their names
    out["<file names>"] = "\n".join(files)
    return out


def test_every_collection_pin_is_used():
    text = tracked_text()
    pins = [c["name"] for c in yaml.safe_load((ROOT / "requirements.yml").read_text())["collections"]]
    unused = [p for p in pins if not any(re.search(re.escape(p) + r"\.\w", t) for t in text.values())]
    assert not unused, "requirements.yml pins collections nothing uses: %s" % unused


def test_every_python_requirement_is_used():
    text = tracked_text()
    names = [re.split(r"[=<>\[ ]", line.strip(), maxsplit=1)[0].lower()
             for line in (ROOT / "requirements.txt").read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    unknown = [n for n in names if n not in PY_USES]
    assert not unknown, "add how each is used to PY_USES: %s" % unknown
    unused = [n for n in names if not any(PY_USES[n] in t for t in text.values())]
    assert not unused, "requirements.txt pins packages nothing uses: %s" % unused
