#!/usr/bin/env python3
"""tools/bench/weights_bench.py [--gib 8] [--keep-model] [--out FILE]      (a benchmark, not a test)

The weights stage (roles/model_weights through playbooks/weights.yml) on the sandbox with a generated model of real
shape, against the physical limits measured on the same machine in the same run, right before (docs/weights-staging.md):

  model    .cache/weights-bench/src/moonshotai/Kimi-K3: safetensors shards of 1-2 GiB (real headers, random
           incompressible bytes) + model.safetensors.index.json + config + tokenizer, --gib in all (default 8), and the
           small draft model RadixArk/Kimi-K3-DSpark; the kimi_k3 profile's two directories. Generated once, ignored
           by git (.cache), removed with --clean.
  W        disk write with fdatasync on b300a, into the stage's target file system, P writers at once (P = the stage's
           model_weights_parallel_files), each writing 2 GiB of unique random 16 MiB blocks (no read side)
  N        the transport alone: curl from b300a of the two largest shards from the controller's server (the stage's
           own byte-range server, same address and port), P at once, into /dev/null
  H        sha256 on b300a, P threads at once over 16 MiB buffers (CPU only)
  cold     playbooks/weights.yml -l b300a: controller path source -> b300a (the stage module's own elapsed time)
  second   playbooks/weights.yml -l b300a,b300b: b300b pulls from b300a (b300a complete: the source is not touched)
  rerun    the same again, nothing to do: wall time, the inspect module's time, its /proc/self/io, and inotify on the
           hosts' model directories (IN_OPEN/IN_ACCESS of weight files: the kernel's count of opens and reads)
  fanout   both hosts emptied, -l b300a,b300b: b300a from the controller and b300b from b300a at the same time,
           file by file; the controller's server counts the bytes it sent (1x the model = each byte once)
  alt      the alternative the stage replaces: curl -o (P at once) + fdatasync + sha256sum of the same shards on b300a

Run it under the sandbox lock:  flock /tmp/b300-integration.lock .venv/bin/python tools/bench/weights_bench.py
Writes artifacts/bench/weights-<UTC>.json and prints the table. The model root on the hosts is
/srv/weights-bench/models (not the stub's), removed at the end.
"""
import argparse
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.b300.rollout.plugins.module_utils import model_weights as mw  # noqa: E402  (the path above)
from ansible_collections.b300.rollout.plugins.module_utils import model_weights_io as mio  # noqa: E402  (the path above)

CACHE = ROOT / ".cache" / "weights-bench"
SRC = CACHE / "src"
MAN = CACHE / "manifests"
HOST_ROOT = "/srv/weights-bench/models"
BIG, DRAFT = "moonshotai/Kimi-K3", "RadixArk/Kimi-K3-DSpark"
GIB = 1 << 30
PORT = 31990
TOKEN = "bench-token-0123456789abcdef"
ENV = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), PATH="%s:%s" % (ROOT / ".venv/bin", os.environ["PATH"]),
           ANSIBLE_FORCE_COLOR="0", ANSIBLE_CACHE_PLUGIN="memory", ANSIBLE_LOAD_CALLBACK_PLUGINS="1",
           ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", CONTAINERS_CONF=str(ROOT / "sandbox/containers.conf"))


def shard_sizes(total_gib):
    """1-2 GiB shards adding up to total_gib (e.g. 8 -> 2, 2, 1.5, 1.5, 1)."""
    pattern = [2.0, 2.0, 1.5, 1.5, 1.0]
    out, left = [], float(total_gib)
    while left > 0:
        s = min(pattern[len(out) % len(pattern)], left)
        if s < 1.0 and out:
            out[-1] += s
        else:
            out.append(s)
        left -= s
    return [int(s * GIB) for s in out]


def write_safetensors(path, size, name):
    """A real safetensors file: 8-byte little-endian header length, JSON header, one U8 tensor of random bytes."""
    data_len = size - 8 - 200
    header = json.dumps({name: {"dtype": "U8", "shape": [data_len], "data_offsets": [0, data_len]}}).encode()
    header += b" " * (200 - len(header))
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        left = data_len
        while left:
            n = min(left, 64 << 20)
            fh.write(os.urandom(n))
            left -= n
    return data_len


def generate(gib):
    stamp = CACHE / ("model-%s.done" % gib)
    if stamp.exists():
        return
    shutil.rmtree(SRC, ignore_errors=True)
    for rel, sizes in ((BIG, shard_sizes(gib)), (DRAFT, [64 << 20])):
        d = SRC / rel
        d.mkdir(parents=True)
        weight_map, total = {}, 0
        for i, size in enumerate(sizes, 1):
            fname = "model-%05d-of-%05d.safetensors" % (i, len(sizes))
            total += write_safetensors(d / fname, size, "layers.%d.weight" % i)
            weight_map["layers.%d.weight" % i] = fname
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}, indent=2))
        (d / "config.json").write_text(json.dumps({"architectures": ["Bench"], "model_type": "bench"}))
        (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
        out = MAN / (rel + ".json")
        subprocess.run([sys.executable, str(ROOT / "tools/weights-manifest"), str(d), "-o", str(out)], check=True)
    stamp.write_text("ok\n")


def sh(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, env=ENV, **kw)


def in_host(host, script, *args, timeout=900):
    """python3 SCRIPT on a sandbox host (podman exec), JSON on its last line."""
    r = subprocess.run(["podman", "exec", "-i", "b300-" + host, "python3", "-", *args], input=script,
                       capture_output=True, text=True, timeout=timeout, env=ENV)
    if r.returncode != 0:
        raise SystemExit("%s: %s" % (host, r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


W_SCRIPT = r"""
import json, os, sys, threading, time
d, per, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(d, exist_ok=True)
def w(i):
    buf = bytearray(os.urandom(16 << 20)); path = os.path.join(d, "w%d.tmp" % i)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for k in range(per // (16 << 20)):
        buf[0:16] = (i * 1000003 + k).to_bytes(16, "little")   # every block unique
        mv = memoryview(buf)
        while mv:
            mv = mv[os.write(fd, mv):]
    os.fdatasync(fd); os.close(fd); os.unlink(path)
t = time.time(); ts = [threading.Thread(target=w, args=(i,)) for i in range(p)]
[x.start() for x in ts]; [x.join() for x in ts]
print(json.dumps({"bytes": per * p, "s": time.time() - t}))
"""

H_SCRIPT = r"""
import hashlib, json, os, sys, threading, time
per, p = int(sys.argv[1]), int(sys.argv[2])
buf = os.urandom(16 << 20)
def h():
    x = hashlib.sha256()
    for _ in range(per // len(buf)):
        x.update(buf)
t = time.time(); ts = [threading.Thread(target=h) for _ in range(p)]
[x.start() for x in ts]; [x.join() for x in ts]
print(json.dumps({"bytes": per * p, "s": time.time() - t}))
"""

N_SCRIPT = r"""
import json, subprocess, sys, time
token, urls = sys.argv[1], sys.argv[2:]
t = time.time()
ps = [subprocess.Popen(["curl", "-sS", "--fail", "-K", "-", "-o", "/dev/null", "-w", "%{size_download}", u],
                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for u in urls]
n = 0
for p in ps:
    out, _ = p.communicate('header = "Authorization: Bearer %s"\n' % token)
    assert p.returncode == 0, p.returncode
    n += int(float(out))
print(json.dumps({"bytes": n, "s": time.time() - t}))
"""

ALT_SCRIPT = r"""
import json, os, subprocess, sys, time
token, d, p, urls = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
os.makedirs(d, exist_ok=True)
t = time.time()
queue, running, n = list(urls), [], 0
def start(u):
    out = os.path.join(d, u.rsplit("/", 1)[1])
    pr = subprocess.Popen(["curl", "-sS", "--fail", "-K", "-", "-o", out, u], stdin=subprocess.PIPE, text=True)
    pr.stdin.write('header = "Authorization: Bearer %s"\n' % token); pr.stdin.close()
    return pr, out
while queue or running:
    while queue and len(running) < p:
        running.append(start(queue.pop(0)))
    pr, out = running.pop(0)
    assert pr.wait() == 0
    fd = os.open(out, os.O_RDONLY); os.fdatasync(fd); os.close(fd)
t_copy = time.time() - t
r = subprocess.run(["sha256sum"] + sorted(os.path.join(d, u.rsplit("/", 1)[1]) for u in urls), capture_output=True)
n = sum(os.path.getsize(os.path.join(d, u.rsplit("/", 1)[1])) for u in urls)
subprocess.run(["rm", "-rf", d])
print(json.dumps({"bytes": n, "s": time.time() - t, "copy_s": t_copy}))
"""


def playbook(limit, extra, label):
    argv = ["ansible-playbook", "playbooks/weights.yml", "-i", "inventory/sandbox", "-l", limit,
            "-e", json.dumps(extra)]
    t0 = time.time()
    r = sh(argv, cwd=ROOT, timeout=3600)
    wall = time.time() - t0
    try:
        doc = json.loads(r.stdout[r.stdout.index("{"):])
    except ValueError:
        raise SystemExit("%s: no JSON (rc %d): %s %s" % (label, r.returncode, r.stdout[-3000:],
                                                         r.stderr[-3000:])) from None
    if r.returncode != 0:
        raise SystemExit("%s failed (rc %d): %s" % (label, r.returncode, json.dumps(doc)[-4000:]))
    tasks = [t for p in doc["plays"] for t in p["tasks"]]

    def results(name):
        return [(h, res) for t in tasks if t["task"]["name"].split(" : ", 1)[-1] == name
                for h, res in t["hosts"].items()]
    stage = {}
    for h, res in results("Stage | stage job state"):
        if res.get("finished"):
            stage[h] = {k: res.get(k) for k in ("elapsed_s", "bytes_fetched", "weight_bytes_read", "io", "rate_bps")}
    inspect = {h: {k: res.get(k) for k in ("elapsed_s", "weight_bytes_read", "meta_bytes_read", "io")}
               for h, res in results("Weights | what each model directory holds (marker + one stat per file; no "
                                     "weight byte read)") if "elapsed_s" in res}
    served = {h: res.get("served") for h, res in results("Cleanup | this host's server ended") if res.get("served")}
    ctl = [res.get("served") for _h, res in results("Cleanup | the controller's server ended") if res.get("served")]
    return {"label": label, "wall_s": round(wall, 2), "stage": stage, "inspect": inspect, "served_by_host": served,
            "served_by_controller": ctl[0] if ctl else {}}


def wipe(hosts):
    for h in hosts:
        subprocess.run(["podman", "exec", "b300-" + h, "rm", "-rf", "/srv/weights-bench"], check=True, env=ENV)


def start_watch(hosts):
    for h in hosts:
        subprocess.run(["podman", "cp", str(ROOT / "tools/bench/inotify_watch.py"), "b300-%s:/tmp/inotify_watch.py" % h],
                       check=True, env=ENV)
        subprocess.run(["podman", "exec", "-d", "b300-" + h, "python3", "/tmp/inotify_watch.py", HOST_ROOT,
                        "/tmp/inotify.json"], check=True, env=ENV)
    for h in hosts:
        for _ in range(100):
            if subprocess.run(["podman", "exec", "b300-" + h, "test", "-f", "/tmp/inotify.json.ready"],
                              env=ENV).returncode == 0:
                break
            time.sleep(0.1)


def stop_watch(hosts):
    out = {}
    for h in hosts:
        subprocess.run(["podman", "exec", "b300-" + h, "pkill", "-TERM", "-f", "^python3 /tmp/inotify_watch.py"],
                       env=ENV)
        for _ in range(50):
            r = subprocess.run(["podman", "exec", "b300-" + h, "cat", "/tmp/inotify.json"], capture_output=True,
                               text=True, env=ENV)
            if r.returncode == 0 and r.stdout.strip():
                out[h] = json.loads(r.stdout)
                break
            time.sleep(0.1)
        subprocess.run(["podman", "exec", "b300-" + h, "rm", "-f", "/tmp/inotify.json", "/tmp/inotify.json.ready"],
                       env=ENV)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--out")
    ap.add_argument("--clean", action="store_true", help="remove the generated model afterwards")
    a = ap.parse_args()
    t_gen = time.time()
    generate(a.gib)
    files = mw.parse_manifest((MAN / (BIG + ".json")).read_text(), "big")
    draft = mw.parse_manifest((MAN / (DRAFT + ".json")).read_text(), "draft")
    total = mw.total_bytes(files) + mw.total_bytes(draft)
    print("model: %s in %d files (+ draft), generated/reused in %.0f s" % (mw.human(total), len(files),
                                                                           time.time() - t_gen), flush=True)
    extra = {"sglang_model_root": HOST_ROOT, "model_weights_manifest_dir": str(MAN),
             "model_weights_source": {"type": "path", "where": "controller", "path": str(SRC)},
             "model_weights_parallel_files": a.parallel, "model_weights_progress_s": 30}
    hosts = ["b300a", "b300b"]
    wipe(hosts)
    # warm the source's page cache (the stage and N read it from there alike)
    for n in files:
        with open(SRC / BIG / n, "rb") as fh:
            while fh.read(64 << 20):
                pass
    res = {"model": {"bytes": total, "files": len(files) + len(draft), "shards": sorted(
        f["size"] for n, f in files.items() if n.endswith(".safetensors"))}, "parallel": a.parallel}
    # --- limits, right before ---
    w = in_host("b300a", W_SCRIPT, "/srv/weights-bench/wtest", str(2 * GIB), str(a.parallel))
    big = sorted((n for n in files if n.endswith(".safetensors")), key=lambda n: -files[n]["size"])[:a.parallel]
    srv = mio.WeightsServer("10.89.30.1", PORT, TOKEN, [{"rel": BIG, "names": set(files), "root": str(SRC)}],
                            kind="source")
    srv.start()
    try:
        urls = [mio.url_for("http://10.89.30.1:%d/v1/files" % PORT, BIG, n) for n in big]
        nrate = in_host("b300a", N_SCRIPT, TOKEN, *urls)
        hrate = in_host("b300a", H_SCRIPT, str(2 * GIB), str(a.parallel))
        shards = [mio.url_for("http://10.89.30.1:%d/v1/files" % PORT, BIG, n) for n in sorted(files)
                  if n.endswith(".safetensors")]
        alt = in_host("b300a", ALT_SCRIPT, TOKEN, "/srv/weights-bench/alt", str(a.parallel), *shards)
    finally:
        srv.stop()
    res["limits"] = {k: dict(v, rate_Bps=v["bytes"] / v["s"]) for k, v in (("W", w), ("N", nrate), ("H", hrate))}
    lim = min(v["rate_Bps"] for v in res["limits"].values())
    res["limits"]["L"] = {"rate_Bps": lim, "bound_by": min(res["limits"], key=lambda k: res["limits"][k]["rate_Bps"])}
    res["alt_curl_then_sha256sum"] = dict(alt, rate_Bps=alt["bytes"] / alt["s"])
    print("W %.0f MB/s, N %.0f MB/s, H %.0f MB/s -> L %.0f MB/s (%s); alt curl+sha256sum %.0f MB/s" % (
        w["bytes"] / w["s"] / 1e6, nrate["bytes"] / nrate["s"] / 1e6, hrate["bytes"] / hrate["s"] / 1e6, lim / 1e6,
        res["limits"]["L"]["bound_by"], alt["bytes"] / alt["s"] / 1e6), flush=True)
    # --- cold, second host, no-change ---
    cold = playbook("b300a", extra, "cold b300a")
    second = playbook("b300a,b300b", extra, "second host b300b from b300a")
    start_watch(hosts)
    rerun = playbook("b300a,b300b", extra, "no-change re-run")
    rerun["inotify"] = stop_watch(hosts)
    # --- both at once, pipelined ---
    wipe(hosts)
    fan = playbook("b300a,b300b", extra, "fan-out: both hosts empty")
    wipe(hosts)
    res.update(cold=cold, second=second, rerun=rerun, fanout=fan)
    t_cold = cold["stage"]["b300a"]["elapsed_s"]
    t_second = second["stage"]["b300b"]["elapsed_s"]
    weight_events = {h: sum(n for k, n in ev.get(kind, {}).items() if k.endswith(".safetensors"))
                     for h, ev in rerun["inotify"].items() for kind in ("open", "access")}
    res["ratios"] = {
        "cold_rate_Bps": total / t_cold, "cold_vs_L": total / t_cold / lim,
        "second_vs_cold": t_second / t_cold,
        "rerun_wall_vs_cold_wall": rerun["wall_s"] / cold["wall_s"],
        "rerun_inspect_vs_cold_stage": max(v["elapsed_s"] for v in rerun["inspect"].values()) / t_cold,
        "rerun_weight_bytes_read": {h: v["weight_bytes_read"] for h, v in rerun["inspect"].items()},
        "rerun_inotify_weight_file_events": weight_events,
        "fanout_b_vs_a": fan["stage"]["b300b"]["elapsed_s"] / fan["stage"]["b300a"]["elapsed_s"],
        "fanout_b_vs_cold": fan["stage"]["b300b"]["elapsed_s"] / t_cold,
        "fanout_source_bytes_vs_model": (fan["served_by_controller"].get(BIG, {}).get("bytes", 0)
                                         + fan["served_by_controller"].get(DRAFT, {}).get("bytes", 0)) / total,
        "alt_vs_stage": (alt["bytes"] / alt["s"]) / (total / t_cold),
    }
    out = pathlib.Path(a.out) if a.out else ROOT / "artifacts" / "bench" / ("weights-%s.json" % time.strftime(
        "%Y%m%dT%H%M%SZ", time.gmtime()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    r = res["ratios"]
    print(json.dumps(r, indent=1))
    print("written %s" % out)
    if a.clean:
        shutil.rmtree(CACHE, ignore_errors=True)


if __name__ == "__main__":
    main()
