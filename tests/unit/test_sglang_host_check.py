"""roles/sglang/files/sglang_host_check.py: weights (config, tokenizer, indexed shards, total size, readability,
ProtectHome), manifest, host RAM for the hierarchical cache, free disk, advertise address."""
import hashlib
import json
import grp
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import sglang_host_check as hc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "roles", "sglang", "files", "sglang_host_check.py")

GLM_PREFILL = ["--model-path", "{m}", "--tp", "4", "--mem-fraction-static", "0.87", "--enable-hierarchical-cache",
               "--hicache-ratio", "2", "--hicache-size", "0"]


def model(tmp_path, name="GLM", shards=3, shard_bytes=1000, total=None, drop=None, tokenizer=True):
    d = tmp_path / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    files = ["model-%05d-of-%05d.safetensors" % (i + 1, shards) for i in range(shards)]
    for f in files:
        if f != drop:
            (d / f).write_bytes(b"\0" * shard_bytes)
    wm = {"layer.%d" % i: f for i, f in enumerate(files)}
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total if total is not None else shards * shard_bytes}, "weight_map": wm}))
    return d


def spec(inst_args, **kw):
    s = {"host": "b300a", "instances": [{"id": "P0", "args": inst_args, "gpus": [0, 1, 2, 3]}],
         "model_check": True, "protect_home": "yes", "user": "root", "memory_check": False, "disk_paths": []}
    s.update(kw)
    return s


def test_complete_model_passes(tmp_path):
    d = model(tmp_path)
    res = hc.check(spec(["--model-path", str(d)]))
    assert res["ok"], res["problems"]
    assert res["facts"]["weights_bytes"][str(d)] == 3000


def test_missing_directory_shard_config_tokenizer_and_size_are_named(tmp_path):
    res = hc.check(spec(["--model-path", str(tmp_path / "nothere")]))
    assert "b300a: P0 model directory %s is missing" % (tmp_path / "nothere") in res["problems"][0]
    d = model(tmp_path, "A", drop="model-00002-of-00003.safetensors")
    msg = " ".join(hc.check(spec(["--model-path", str(d)]))["problems"])
    assert "lacks 1 of the 3 shards its index lists (model-00002-of-00003.safetensors)" in msg
    d = model(tmp_path, "B", total=6000)
    msg = " ".join(hc.check(spec(["--model-path", str(d)]))["problems"])
    assert "total 3000 bytes, the index says 6000 (tolerance 5" in msg
    d = model(tmp_path, "C", tokenizer=False)
    (d / "config.json").unlink()
    msg = " ".join(hc.check(spec(["--model-path", str(d)]))["problems"])
    assert "has no config.json" in msg and "has no tokenizer file" in msg


def test_draft_model_is_checked_too(tmp_path):
    d = model(tmp_path)
    res = hc.check(spec(["--model-path", str(d), "--speculative-draft-model-path", str(tmp_path / "draft")]))
    assert not res["ok"] and "P0 draft model directory" in res["problems"][0]


def test_weights_under_home_refused_with_protect_home(tmp_path):
    res = hc.check(spec(["--model-path", "/home/ops/models/GLM"]))
    msg = res["problems"][0]
    assert "under /home, which ProtectHome=yes hides from the service" in msg and "move the weights" in msg
    res = hc.check(spec(["--model-path", "/root/GLM"], protect_home="no"))
    assert not any("ProtectHome" in p for p in res["problems"])


def test_unreadable_by_the_service_user_is_named():
    top = tempfile.mkdtemp(prefix="b300-hostcheck-", dir="/tmp")
    try:
        os.chmod(top, 0o755)
        d = model(pathlib.Path(top))
        os.chmod(d, 0o755)
        assert hc.check(spec(["--model-path", str(d)], user="no-such-user-b300"))["ok"]
        os.chmod(d / "model-00001-of-00003.safetensors", 0o600)
        # a user that does not exist yet counts as "others"
        res = hc.check(spec(["--model-path", str(d)], user="no-such-user-b300"))
        assert [p for p in res["problems"]
                if "model-00001-of-00003.safetensors is not readable by no-such-user-b300 (mode 600)" in p
                and "chmod -R a+rX" in p], res["problems"]
        os.chmod(d, 0o700)
        res = hc.check(spec(["--model-path", str(d)], user="no-such-user-b300"))
        assert [p for p in res["problems"] if "directory %s is not searchable by no-such-user-b300" % d in p]
        # the weights stage's root:<service group> 0750 before the deploy created the user: the user will be in
        # that group (a fresh host's site.yml: weights step, then this check, then the user)
        os.chmod(d / "model-00001-of-00003.safetensors", 0o640)
        os.chmod(d, 0o750)
        gid = os.stat(d).st_gid
        group = grp.getgrgid(gid).gr_name
        assert hc.check(dict(spec(["--model-path", str(d)], user="no-such-user-b300"), group=group))["ok"]
        assert not hc.check(dict(spec(["--model-path", str(d)], user="no-such-user-b300"),
                                 group="no-such-group-b300"))["ok"]
    finally:
        shutil.rmtree(top)


def test_manifest_mismatch_is_named(tmp_path):
    d = model(tmp_path)
    good = hashlib.sha256(b"{}").hexdigest()
    assert hc.check(spec(["--model-path", str(d)], manifest={str(d / "config.json"): good}))["ok"]
    res = hc.check(spec(["--model-path", str(d)], manifest={str(d / "config.json"): "0" * 64}))
    assert "config.json sha256 %s, the manifest says %s" % (good, "0" * 64) in res["problems"][0]


def test_hicache_memory_refused_with_numbers(tmp_path):
    d = model(tmp_path)
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       2113929216 kB\n")   # 2016 GiB
    args = [a.replace("{m}", str(d)) for a in GLM_PREFILL]
    s = spec(args, memory_check=True, gpu_memory_mib=275040, memory_reserve_gib=64,
             instances=[{"id": "P0", "args": args, "gpus": [0, 1, 2, 3]}, {"id": "P1", "args": args, "gpus": [4, 5, 6, 7]}])
    res = hc.check(s, meminfo=str(meminfo))
    # per rank 2 x 0.87 x 268.6 GiB = 467 GiB, x 4 ranks = 1869 GiB per instance > 2016 GiB
    assert not res["ok"]
    msg = res["problems"][0]
    assert "host memory 2016 GiB (MemTotal) is less than the hierarchical cache needs: P0 1869 GiB + P1 1869 GiB" in msg
    assert "lower --hicache-ratio or set --hicache-size" in msg
    meminfo.write_text("MemTotal:       4294967296 kB\n")   # 4 TiB
    assert hc.check(s, meminfo=str(meminfo))["ok"]
    # without the hierarchical cache nothing is needed
    s["instances"] = [{"id": "D0", "args": ["--model-path", str(d)], "gpus": [0, 1, 2, 3]}]
    meminfo.write_text("MemTotal:       1024 kB\n")
    assert hc.check(s, meminfo=str(meminfo))["ok"]


def test_free_disk_refused(tmp_path):
    res = hc.check(spec([], model_check=False, disk_paths=[str(tmp_path / "opt" / "sglang")], disk_min_free_gib=10 ** 6))
    assert "GiB free on the filesystem of %s" % (tmp_path / "opt" / "sglang") in res["problems"][0]


def test_advertise_address_loopback_and_foreign_refused(monkeypatch):
    monkeypatch.setattr(hc, "host_addresses", lambda: {"127.0.0.1", "10.0.0.11", "192.168.1.5"})
    assert hc.check(spec([], model_check=False, advertise_address="10.0.0.11"))["ok"]
    msg = hc.check(spec([], model_check=False, advertise_address="127.0.1.1"))["problems"][0]
    assert "b300a: sglang_advertise_address 127.0.1.1 is a loopback address" in msg
    msg = hc.check(spec([], model_check=False, advertise_address="10.0.0.12"))["problems"][0]
    assert "10.0.0.12 is not an address of this host (found: 10.0.0.11, 192.168.1.5)" in msg


def test_script_exit_codes(tmp_path):
    d = model(tmp_path)
    ok = subprocess.run([sys.executable, SCRIPT, json.dumps(spec(["--model-path", str(d)]))], capture_output=True,
                        text=True, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["ok"]
    bad = subprocess.run([sys.executable, SCRIPT, json.dumps(spec(["--model-path", str(tmp_path / "x")]))],
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and not json.loads(bad.stdout)["ok"]
