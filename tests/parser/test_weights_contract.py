"""The weights stage's manifest against the REAL SGLang (0.5.17 and 0.5.18, CPU venvs of
tools/sglang_argcheck/build_venv.sh): `python -m sglang.srt.utils.model_file_verifier verify` accepts the manifest
the stage wrote next to the weights (.b300-manifest.json) and the directory it staged, and refuses the same directory
after one byte of a shard changed; the manifest the real `generate` writes is read by module_utils/weights/model_weights.py
with the same digest as tools/weights-manifest's. The module is run as `python -m`, i.e. the real package import
(sglang/__init__ pulls srt/utils/common, which imports triton: tools/sglang_argcheck/standins keeps that import
working on CPU, as for the parser tests; nothing of the verifier itself is stood in for).

Run with the parser tests:  pytest -m real_parser tests/parser
"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw  # noqa: E402  (the path above)

import forkserver  # noqa: E402  (tests/parser, beside this file)

VERSIONS = ("0.5.17", "0.5.18")
MOD = ROOT / "collections/ansible_collections/b300/rollout/plugins/modules/model_weights_stage.py"
pytestmark = pytest.mark.real_parser


@pytest.fixture(scope="module")
def venvs():
    out = {}
    for ver in VERSIONS:
        proc = subprocess.run([str(ROOT / "tools/sglang_argcheck/build_venv.sh"), ver], capture_output=True, text=True,
                              timeout=1800)
        if proc.returncode != 0:
            pytest.fail("building the sglang %s CPU venv failed (rc %d):\n%s" % (ver, proc.returncode,
                                                                                proc.stderr[-3000:]))
        out[ver] = pathlib.Path(proc.stdout.strip().splitlines()[-1]) / "bin" / "python"
    return out


# One interpreter per version runs the real CLI several times (its import of sglang costs ~10 s): each call is
# runpy.run_module("sglang.srt.utils.model_file_verifier", run_name="__main__") with its own sys.argv, i.e. exactly
# what `python -m sglang.srt.utils.model_file_verifier ARGS` runs; its exit (SystemExit / IntegrityError) is recorded.
PROBE = r"""
import contextlib, io, json, runpy, sys, traceback
out = []
for argv in json.loads(sys.argv[1]):
    sys.argv = ["model_file_verifier"] + argv
    so, se = io.StringIO(), io.StringIO()
    rc = 0
    with contextlib.redirect_stdout(so), contextlib.redirect_stderr(se):
        try:
            runpy.run_module("sglang.srt.utils.model_file_verifier", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 1
        except Exception:
            rc = 1
            traceback.print_exc()
    out.append({"rc": rc, "stdout": so.getvalue(), "stderr": se.getvalue()})
print(json.dumps(out))
"""


def verifier(python, calls):
    if forkserver.enabled():
        # each call `python -m sglang.srt.utils.model_file_verifier ARGS` in a child of the venv's fork server
        # (sglang imported once for both test modules; tests/parser/forkserver.py)
        server = forkserver.sglang(python)
        out = []
        for argv in calls:
            rc, so, se = server.run(["-m", "sglang.srt.utils.model_file_verifier"] + argv, cwd=ROOT)
            out.append({"rc": rc, "stdout": so, "stderr": se})
        return out
    env = dict(os.environ, PYTHONPATH=str(ROOT / "tools/sglang_argcheck/standins"))
    r = subprocess.run([str(python), "-c", PROBE, json.dumps(calls)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def staged(tmp_path_factory):
    """A small model of real shape staged by the real module (path source), as the role stages one."""
    t = tmp_path_factory.mktemp("weights")
    src = t / "src" / "org" / "M"
    src.mkdir(parents=True)
    files = {}
    for n, s in (("config.json", 120), ("tokenizer.json", 300), ("model.safetensors.index.json", 200),
                 ("model-00001-of-00002.safetensors", 1 << 20), ("model-00002-of-00002.safetensors", 777777)):
        b = os.urandom(s)
        (src / n).write_bytes(b)
        files[n] = {"sha256": hashlib.sha256(b).hexdigest(), "size": s}
    args = {"mode": "stage", "host": "test", "group": "root", "run_dir": str(t / "run"),
            "models": [{"rel": "org/M", "final": str(t / "dst" / "org" / "M"), "need": "full", "files": files,
                        "where": "test", "source": {"type": "path", "path": str(t / "src")}}]}
    (t / "args.json").write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    r = subprocess.run([sys.executable, str(MOD), str(t / "args.json")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "collections")))
    res = json.loads(r.stdout)
    assert not res.get("failed"), res.get("msg")
    return {"src": src, "final": t / "dst" / "org" / "M", "files": files, "tmp": t}


@pytest.mark.parametrize("ver", VERSIONS)
def test_real_verifier_on_what_the_stage_wrote(venvs, staged, ver, tmp_path):
    final, manifest = staged["final"], staged["final"] / mw.MANIFEST_NAME
    # a copy with one byte changed in a shard, checked against the same manifest
    copy = tmp_path / "M"
    copy.mkdir()
    for n in staged["files"]:
        (copy / n).write_bytes((final / n).read_bytes())
    shard = copy / "model-00002-of-00002.safetensors"
    b = bytearray(shard.read_bytes())
    b[1000] ^= 1
    shard.write_bytes(b)
    real = tmp_path / "real.json"
    ok, bad, gen = verifier(venvs[ver], [
        ["verify", "--model-path", str(final), "--model-checksum", str(manifest)],
        ["verify", "--model-path", str(copy), "--model-checksum", str(manifest)],
        ["generate", "--model-path", str(staged["src"]), "--model-checksum", str(real)]])
    # the staged directory and the manifest the stage wrote beside it pass the real verify
    assert ok["rc"] == 0, ok["stderr"][-2000:]
    assert "[ModelFileVerifier] All 5 files verified successfully." in ok["stdout"]
    # one changed byte: the real verifier raises IntegrityError naming the shard
    assert bad["rc"] != 0
    assert "IntegrityError: Integrity check failed: model-00002-of-00002.safetensors: mismatch" in bad["stderr"]
    # the real generate on the source: the stage reads it as the same manifest, with the digest tools/weights-manifest
    # prints, byte for byte the same file (SGLang writes no final newline)
    assert gen["rc"] == 0, gen["stderr"][-2000:]
    assert mw.parse_manifest(real.read_text(), str(real)) == staged["files"]
    ours = tmp_path / "ours.json"
    subprocess.run([sys.executable, str(ROOT / "tools/weights-manifest"), str(staged["src"]), "-o", str(ours)],
                   check=True, capture_output=True)
    assert real.read_text() == ours.read_text().rstrip("\n")
    assert mw.manifest_digest(mw.parse_manifest(real.read_text(), "real")) == mw.manifest_digest(staged["files"])
