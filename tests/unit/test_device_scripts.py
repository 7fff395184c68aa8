"""tools/device/: what a newcomer runs for a lent GPU machine works without one (controller only, no GPU, no network).

- nccl_tests_archive.sh makes .src/nccl-tests-<ver>.tar.gz from a git clone holding the tag and keeps it only when its
  sha256 is the role's pin (a wrong one is removed and named with the expected sha256);
- all_run.sh plans its parts within one device command: the triage and the health history run too, `-g 1` only on a
  machine with more than one GPU, and a part that no longer fits the budget is skipped, not started;
- the device docs point at nothing outside the repository.
The scripts themselves run on the GPU machine only in the lead's device calls (tools/device/README.md).
"""
import hashlib
import os
import pathlib
import re
import subprocess

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEVICE = ROOT / "tools" / "device"
DEFAULTS = yaml.safe_load((ROOT / "roles" / "nccl_validation" / "defaults" / "main.yml").read_text())
VER = DEFAULTS["nccl_validation_tests_version"]
GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.invalid", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@example.invalid", GIT_CONFIG_GLOBAL="/dev/null")


def _clone_with_tag(tmp_path):
    src = tmp_path / "nccl-tests"
    src.mkdir()
    (src / "Makefile").write_text("all:\n")
    for cmd in (["init", "-q"], ["add", "."], ["-c", "commit.gpgsign=false", "commit", "-qm", "x"], ["tag", "v" + VER]):
        subprocess.run(["git", *cmd], cwd=src, env=GIT_ENV, check=True)
    return src


def _archive(source, tmp_path, **env):
    return subprocess.run(["bash", str(DEVICE / "nccl_tests_archive.sh"), str(source)], capture_output=True, text=True,
                          env=dict(os.environ, NCCL_TESTS_SRC_DIR=str(tmp_path / "src"), **env))


def test_archive_from_a_clone_is_kept_only_with_the_pinned_sha256(tmp_path):
    src = _clone_with_tag(tmp_path)
    dest = tmp_path / "src" / ("nccl-tests-%s.tar.gz" % VER)
    r = _archive(src, tmp_path)   # a clone that is not NVIDIA's: its archive is not the pinned one
    assert r.returncode == 1 and not dest.exists(), r.stderr
    assert "expected %s (the role's pin for nccl-tests %s)" % (DEFAULTS["nccl_validation_tests_archive_sha256"], VER) \
        in r.stderr
    made = subprocess.run(["git", "archive", "--format=tar.gz", "--prefix=nccl-tests-%s/" % VER, "v" + VER], cwd=src,
                          capture_output=True, check=True).stdout
    r = _archive(src, tmp_path, NCCL_TESTS_SHA256=hashlib.sha256(made).hexdigest())
    assert r.returncode == 0, r.stderr
    assert dest.read_bytes() == made


def test_archive_refuses_what_is_neither_a_clone_nor_a_file(tmp_path):
    r = _archive(tmp_path / "nothing", tmp_path)
    assert r.returncode == 1 and "neither a git clone of NVIDIA/nccl-tests with the tag v%s" % VER in r.stderr


def _plan(tmp_path, gpus, **env):
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    smi = fake / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join('echo "GPU %d: NVIDIA H200 (UUID: GPU-%d)"\n' % (i, i) for i in range(gpus)))
    smi.chmod(0o755)
    out = tmp_path / ("out%d" % gpus)
    r = subprocess.run(["bash", str(DEVICE / "all_run.sh")], capture_output=True, text=True, cwd=str(tmp_path),
                       env=dict(os.environ, PATH="%s:%s" % (fake, os.environ["PATH"]), OUT=str(out), ALL_RUN_DRY="1",
                                **env))
    assert r.returncode == 0, r.stderr
    return (out / "parts.txt").read_text()


def _planned(text):
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(\w+) cap=\d+s min=(\d+)s: ", text, re.M)}


def test_all_run_plans_every_part_within_one_command(tmp_path):
    two = _planned(_plan(tmp_path, 2))
    assert list(two) == ["facts", "nccl_all", "triage", "history", "thermal", "nccl_g1", "thermal_dmon"]
    budget = int(re.search(r"^BUDGET_S=\$\{BUDGET_S:-(\d+)\}", (DEVICE / "all_run.sh").read_text(), re.M).group(1))
    assert sum(two.values()) <= budget <= 600 - 30   # the device command limit, less the packing


def test_all_run_on_one_gpu_does_not_repeat_the_first_nccl_run(tmp_path):
    text = _plan(tmp_path, 1)
    assert "nccl_g1" not in _planned(text) and "nccl_g1 skipped: one GPU, nccl_all was the -g 1 run" in text
    assert {"triage", "history"} <= set(_planned(text))


def test_all_run_skips_what_no_longer_fits(tmp_path):
    text = _plan(tmp_path, 2, BUDGET_S="200")
    assert list(_planned(text)) == ["facts", "nccl_all", "triage", "nccl_g1"]   # a short later part still fits
    assert re.search(r"^history skipped: \d+s of BUDGET_S=\d+s left, it needs 75s$", text, re.M), text


def test_device_docs_point_at_nothing_outside_the_repository():
    bad = ["%s:%d" % (p.name, n) for p in sorted(DEVICE.iterdir()) if p.is_file()
           for n, line in enumerate(p.read_text().splitlines(), 1) if "../shared" in line]
    assert not bad, bad
    assert DEFAULTS["nccl_validation_tests_archive_sha256"] in (DEVICE / "README-nccl.md").read_text()
