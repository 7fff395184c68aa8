#!/usr/bin/env python3
"""tools/bench/weights_bench.py [--gib 8] [--parallel 2] [--variants end,behind,behind+drop] [--main behind] [--out FILE]
tools/bench/weights_bench.py --local [--gib 8] [--parallel-files 2,4,8] [--dir DIR] [--w-gib 8]
      (one machine, no containers: tools/bench/weights_bench_local.py says how)
                                                                                   (a benchmark, not a test)

The weights stage (roles/model_weights through playbooks/weights.yml) on the sandbox with a generated model of real
shape, against the physical limits measured on the same machine in the same run, right before (docs/weights-staging.md):

  model    .cache/weights-bench/src/moonshotai/Kimi-K3: safetensors shards of 1-2 GiB (real headers, random
           incompressible bytes) + model.safetensors.index.json + config + tokenizer, --gib in all (default 8), and the
           small draft model RadixArk/Kimi-K3-DSpark; the kimi_k3 profile's two directories. Generated once, ignored
           by git (.cache), removed with --clean.
  W        disk write with fdatasync on b300a, into the stage's target file system, P writers at once (P = the stage's
           model_weights_parallel_files), each writing 2 GiB of unique random 16 MiB blocks (no read side); twice:
           fdatasync at the end only, and with the stage's write-behind every 64 MiB (sync_file_range, or fadvise on
           overlayfs); both again after the stage runs. L takes the fastest of the four (the disk's best: never a
           weaker limit than the issue 28 run's, which is kept as L_first_W)
  N        the transport alone: curl from b300a of the two largest shards from the controller's server (the stage's
           own byte-range server, same address and port), P at once, into /dev/null
  H        sha256 on b300a, P threads at once over 16 MiB buffers (CPU only)
  cold     playbooks/weights.yml -l b300a: controller path source -> b300a (the stage module's own elapsed time)
  second   playbooks/weights.yml -l b300a,b300b: b300b pulls from b300a (b300a complete: the source is not touched)
           cold and second once per --variants entry, in this run, hosts emptied in between: end (the issue 28
           write-back: the kernel's, fdatasync at the end), behind (the default), behind+drop
           (model_weights_drop_cache), each optionally /pN (N files at once)
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
from concurrent.futures import ThreadPoolExecutor

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "collections"))
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw  # noqa: E402  (the path above)
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio  # noqa: E402  (the path above)

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


def shard_sizes(total_gib, shard_gib=None):
    """1-2 GiB shards adding up to total_gib (e.g. 8 -> 2, 2, 1.5, 1.5, 1); shard_gib: shards of that size instead
    (a small model with several shards, so that several files can be staged at once)."""
    pattern = [shard_gib] if shard_gib else [2.0, 2.0, 1.5, 1.5, 1.0]
    out, left = [], float(total_gib)
    while left > 0:
        s = min(pattern[len(out) % len(pattern)], left)
        if s < min(1.0, pattern[0]) and out:
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


def generate(gib, cache=CACHE, workers=1, shard_gib=None):
    """The model (--gib of BIG + the small DRAFT) and its manifests under cache/src and cache/manifests, once per size;
    workers files written and hashed at once."""
    src, man = cache / "src", cache / "manifests"
    stamp = cache / ("model-%s%s.done" % (gib, "-%s" % shard_gib if shard_gib else ""))
    if stamp.exists():
        return
    shutil.rmtree(src, ignore_errors=True)
    jobs = []
    for rel, sizes in ((BIG, shard_sizes(gib, shard_gib)), (DRAFT, [64 << 20])):
        d = src / rel
        d.mkdir(parents=True)
        weight_map, total = {}, 0
        for i, size in enumerate(sizes, 1):
            fname = "model-%05d-of-%05d.safetensors" % (i, len(sizes))
            jobs.append((d / fname, size, "layers.%d.weight" % i))
            total += size - 8 - 200   # write_safetensors' tensor bytes
            weight_map["layers.%d.weight" % i] = fname
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}, indent=2))
        (d / "config.json").write_text(json.dumps({"architectures": ["Bench"], "model_type": "bench"}))
        (d / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE", "vocab": {}}}))
    with ThreadPoolExecutor(max_workers=max(1, workers)) as ex:   # os.urandom and write() release the GIL
        list(ex.map(lambda j: write_safetensors(*j), jobs))
    for rel in (BIG, DRAFT):
        out = man / (rel + ".json")
        subprocess.run([sys.executable, str(ROOT / "tools/weights-manifest"), str(src / rel), "-o", str(out),
                        "--workers", str(max(1, workers))], check=True)
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
import ctypes, json, os, subprocess, sys, threading, time
d, per, p = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
behind = len(sys.argv) > 4 and sys.argv[4] == "behind"   # the stage's write-behind, per 64 MiB
sfr = ctypes.CDLL("libc.so.6", use_errno=True).sync_file_range
sfr.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
WIN = 64 << 20
os.makedirs(d, exist_ok=True)
fstype = subprocess.run(["stat", "-f", "-c", "%T", d], capture_output=True, text=True).stdout.strip()
how = "fadvise" if "overlay" in fstype else "sfr"   # as the stage: sync_file_range does nothing on overlayfs
def kick(fd, off):
    if how == "sfr":
        sfr(fd, off, WIN, 2)
    else:
        os.posix_fadvise(fd, off, WIN, os.POSIX_FADV_DONTNEED)
def settle(fd, off):
    if how == "sfr":
        sfr(fd, off, WIN, 7)
def w(i):
    buf = bytearray(os.urandom(16 << 20)); path = os.path.join(d, "w%d.tmp" % i)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    pos, done, inflight = 0, 0, []
    for k in range(per // (16 << 20)):
        buf[0:16] = (i * 1000003 + k).to_bytes(16, "little")   # every block unique
        mv = memoryview(buf)
        while mv:
            n = os.write(fd, mv); mv = mv[n:]; pos += n
        while behind and pos - done >= WIN:
            kick(fd, done); inflight.append(done); done += WIN
            if len(inflight) > 1:
                settle(fd, inflight.pop(0))
    os.fdatasync(fd); os.close(fd); os.unlink(path)
t = time.time(); ts = [threading.Thread(target=w, args=(i,)) for i in range(p)]
[x.start() for x in ts]; [x.join() for x in ts]
print(json.dumps({"bytes": per * p, "s": time.time() - t, "fstype": fstype, "how": how if behind else "end"}))
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
    return dict(parse_run(doc), label=label, wall_s=round(wall, 2))


def parse_run(doc):
    """The stage's, the inspect's and the servers' results out of a run's JSON (the ansible.posix json callback's
    shape, which tools/bench/callback_plugins/bench_results.py writes too)."""
    tasks = [t for p in doc["plays"] for t in p["tasks"]]

    def results(name):
        return [(h, res) for t in tasks if t["task"]["name"].split(" : ", 1)[-1] == name
                for h, res in t["hosts"].items()]
    stage = {}
    for h, res in results("Stage | stage job state"):
        if res.get("finished"):
            stage[h] = {k: res.get(k) for k in ("elapsed_s", "bytes_fetched", "weight_bytes_read", "io", "rate_bps",
                                                "fsync_s")}
            stage[h]["errors"] = res.get("errors")
            stage[h]["writeback"] = sorted({m.get("writeback") for m in res.get("models") or [] if m.get("writeback")})
    inspect = {h: {k: res.get(k) for k in ("elapsed_s", "weight_bytes_read", "meta_bytes_read", "io")}
               for h, res in results("Weights | what each model directory holds (marker + one stat per file; no "
                                     "weight byte read)") if "elapsed_s" in res}
    served = {h: res.get("served") for h, res in results("Cleanup | this host's server ended") if res.get("served")}
    ctl = [res.get("served") for _h, res in results("Cleanup | the controller's server ended") if res.get("served")]
    return {"stage": stage, "inspect": inspect, "served_by_host": served, "served_by_controller": ctl[0] if ctl else {}}


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


VARIANTS = {   # the stage's write-back settings a run compares (--variants), each with cold + second host
    "end": {"model_weights_writeback": "end", "model_weights_drop_cache": False},
    "behind": {"model_weights_writeback": "behind", "model_weights_drop_cache": False},
    "behind+drop": {"model_weights_writeback": "behind", "model_weights_drop_cache": True},
}


def variant_extra(spec, extra):
    """'behind', 'end', 'behind+drop', optionally '/pN' (model_weights_parallel_files N) -> the playbook's vars."""
    name, _sep, par = spec.split("#", 1)[0].partition("/p")
    if name not in VARIANTS:
        raise SystemExit("unknown variant %r (one of %s, optionally /pN)" % (spec, ", ".join(VARIANTS)))
    out = dict(extra, **VARIANTS[name])
    if par:
        out["model_weights_parallel_files"] = int(par)
    return out


def warm(files):
    """Read the source through (the stage and N read it from the page cache alike)."""
    for n in files:
        with open(SRC / BIG / n, "rb") as fh:
            while fh.read(64 << 20):
                pass


def disk_limits(parallel):
    """W twice: the fdatasync at the end only, and with the stage's write-behind (the same writes as the stage's
    writer; the faster of the two is the disk's rate)."""
    out = {}
    for mode in ("end", "behind"):
        out[mode] = in_host("b300a", W_SCRIPT, "/srv/weights-bench/wtest", str(2 * GIB), str(parallel), mode)
        out[mode]["rate_Bps"] = out[mode]["bytes"] / out[mode]["s"]
    return out


def main():
    a = parse_args()
    if a.local:
        import weights_bench_local   # beside this file (sys.path[0])
        return weights_bench_local.run_local(a)
    t_gen = time.time()
    generate(a.gib)
    files = mw.parse_manifest((MAN / (BIG + ".json")).read_text(), "big")
    draft = mw.parse_manifest((MAN / (DRAFT + ".json")).read_text(), "draft")
    total = mw.total_bytes(files) + mw.total_bytes(draft)
    print("model: %s in %d files (+ draft), generated/reused in %.0f s" % (mw.human(total), len(files),
                                                                           time.time() - t_gen), flush=True)
    base = {"sglang_model_root": HOST_ROOT, "model_weights_manifest_dir": str(MAN),
            "model_weights_source": {"type": "path", "where": "controller", "path": str(SRC)},
            "model_weights_parallel_files": a.parallel, "model_weights_progress_s": 30}
    specs = [v.strip() for v in a.variants.split(",") if v.strip()]
    if a.main not in specs:
        specs.append(a.main)
    labels, seen = [], {}
    for v in specs:
        seen[v] = seen.get(v, 0) + 1
        labels.append(v if seen[v] == 1 else "%s#%d" % (v, seen[v]))
    hosts = ["b300a", "b300b"]
    wipe(hosts)
    warm(files)
    res = {"model": {"bytes": total, "files": len(files) + len(draft), "shards": sorted(
        f["size"] for n, f in files.items() if n.endswith(".safetensors"))}, "parallel": a.parallel,
        "variants_order": labels, "main": a.main}
    # --- limits, right before ---
    w_before, alt = measure_limits(a, files, res)
    # --- cold and second host, per variant, in this run ---
    runs = run_variants(labels, specs, base, hosts, files)
    main_label = labels[specs.index(a.main)]
    main_extra = variant_extra(a.main, base)
    # --- no-change (the hosts hold the last variant's copies) ---
    start_watch(hosts)
    rerun = playbook("b300a,b300b", main_extra, "no-change re-run")
    rerun["inotify"] = stop_watch(hosts)
    # --- both at once, pipelined ---
    wipe(hosts)
    warm(files)
    fan = playbook("b300a,b300b", main_extra, "fan-out: both hosts empty (%s)" % a.main)
    wipe(hosts)
    # --- the disk again, right after (the drift over the run) ---
    w_after = disk_limits(a.parallel)
    wipe(hosts)
    res["limits"]["W_after"] = w_after["end"]
    res["limits"]["W_behind_after"] = w_after["behind"]
    lim, lim_first = limits_summary(res, w_before, w_after)
    res.update(runs=runs, rerun=rerun, fanout=fan)
    res["ratios"] = ratios_of(runs, rerun, fan, alt, total, lim, lim_first, main_label)
    out = pathlib.Path(a.out) if a.out else ROOT / "artifacts" / "bench" / ("weights-%s.json" % time.strftime(
        "%Y%m%dT%H%M%SZ", time.gmtime()))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    print("W end %.0f / behind %.0f MB/s before, %.0f / %.0f after -> L %.0f MB/s (%s)" % (
        w_before["end"]["rate_Bps"] / 1e6, w_before["behind"]["rate_Bps"] / 1e6, w_after["end"]["rate_Bps"] / 1e6,
        w_after["behind"]["rate_Bps"] / 1e6, lim / 1e6, res["limits"]["L"]["bound_by"]))
    print(json.dumps(res["ratios"], indent=1))
    print("written %s" % out)
    if a.clean:
        shutil.rmtree(CACHE, ignore_errors=True)


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=8)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--variants", default="end,behind,behind+drop",
                    help="comma-separated stage settings, each run cold + second host in this run: %s, optionally "
                         "/pN (N files at once); a name twice (end,behind,end) shows the drift" % ", ".join(VARIANTS))
    ap.add_argument("--main", default="behind", help="the variant of the no-change and fan-out runs (the role's "
                                                     "defaults: behind)")
    ap.add_argument("--out")
    ap.add_argument("--clean", action="store_true", help="remove the generated model afterwards")
    ap.add_argument("--local", action="store_true", help="source, stage and limits on this machine, no containers "
                                                         "(tools/bench/weights_bench_local.py; the lent GPU machine)")
    ap.add_argument("--parallel-files", default="2,4,8", help="--local: the model_weights_parallel_files values, "
                                                                "each with its own W, N, H and stage")
    ap.add_argument("--dir", help="--local: the work directory (model, target, logs; default "
                                  ".cache/weights-bench-local), on the file system the stage is measured on")
    ap.add_argument("--w-gib", type=float, default=8, help="--local: GiB written by each W measurement")
    ap.add_argument("--shard-gib", type=float, help="--local: shards of this size (default: 2, 2, 1.5, 1.5, 1 GiB "
                                                    "repeated); a small model needs small shards for P files at once")
    return ap.parse_args()


def measure_limits(a, files, res):
    """W (the disk, end and write-behind), N (the network from the controller's source), H (hashing), and the
    alternative curl + sha256sum, right before the runs, into res["limits"]; returns the disk's and the alternative's
    measures."""
    w_before = disk_limits(a.parallel)
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
    w = w_before["end"]
    res["limits"] = {k: dict(v, rate_Bps=v["bytes"] / v["s"]) for k, v in (("W", w), ("N", nrate), ("H", hrate))}
    res["limits"]["W_behind"] = w_before["behind"]
    res["alt_curl_then_sha256sum"] = dict(alt, rate_Bps=alt["bytes"] / alt["s"])
    print("W %.0f MB/s (write-behind %.0f), N %.0f MB/s, H %.0f MB/s; alt curl+sha256sum %.0f MB/s" % (
        w["rate_Bps"] / 1e6, w_before["behind"]["rate_Bps"] / 1e6, nrate["bytes"] / nrate["s"] / 1e6,
        hrate["bytes"] / hrate["s"] / 1e6, alt["bytes"] / alt["s"] / 1e6), flush=True)
    return w_before, alt


def run_variants(labels, specs, base, hosts, files):
    """Per variant: a cold stage on b300a and the second host b300b from b300a, each from wiped hosts."""
    runs = {}
    for label, spec in zip(labels, specs):
        wipe(hosts)
        warm(files)
        extra = variant_extra(spec, base)
        cold = playbook("b300a", extra, "cold b300a (%s)" % label)
        second = playbook("b300a,b300b", extra, "second host b300b from b300a (%s)" % label)
        runs[label] = {"spec": spec, "vars": {k: v for k, v in extra.items() if k not in base or
                                              base[k] != v}, "cold": cold, "second": second}
        print("%-14s cold %.1f s (fsync %s s), second host %.1f s (fsync %s s)" % (
            label, cold["stage"]["b300a"]["elapsed_s"], cold["stage"]["b300a"].get("fsync_s"),
            second["stage"]["b300b"]["elapsed_s"], second["stage"]["b300b"].get("fsync_s")), flush=True)
    return runs


def limits_summary(res, w_before, w_after):
    """L, the slowest of the best W, N and H (and L with the first W only, the issue 28 run's method), into
    res["limits"]; returns both rates."""
    w = w_before["end"]
    w_max = max(x["rate_Bps"] for x in (w, w_before["behind"], w_after["end"], w_after["behind"]))
    lim = min(w_max, res["limits"]["N"]["rate_Bps"], res["limits"]["H"]["rate_Bps"])
    lim_first = min(w["rate_Bps"], res["limits"]["N"]["rate_Bps"], res["limits"]["H"]["rate_Bps"])
    res["limits"]["W_max"] = {"rate_Bps": w_max}
    res["limits"]["L"] = {"rate_Bps": lim, "bound_by": "W" if lim == w_max else (
        "N" if lim == res["limits"]["N"]["rate_Bps"] else "H"), "method": "min(max of the four W, N, H)"}
    res["limits"]["L_first_W"] = {"rate_Bps": lim_first, "method": "min(W at the start, fdatasync at the end, N, H): "
                                                                   "the issue 28 run's method"}
    return lim, lim_first


def ratios_of(runs, rerun, fan, alt, total, lim, lim_first, main_label):
    """The report's ratios: per variant and for the main one (cold vs L, second host vs cold, no-change re-run,
    fan-out, the alternative's rate)."""
    per = {}
    for label, r in runs.items():
        tc, ts = r["cold"]["stage"]["b300a"]["elapsed_s"], r["second"]["stage"]["b300b"]["elapsed_s"]
        per[label] = {"cold_s": tc, "cold_rate_Bps": total / tc, "cold_vs_L": total / tc / lim,
                      "cold_vs_L_first_W": total / tc / lim_first, "second_s": ts, "second_vs_cold": ts / tc,
                      "cold_fsync_s": r["cold"]["stage"]["b300a"].get("fsync_s"),
                      "second_fsync_s": r["second"]["stage"]["b300b"].get("fsync_s"),
                      "cold_wall_s": r["cold"]["wall_s"], "second_wall_s": r["second"]["wall_s"]}
    t_cold = per[main_label]["cold_s"]
    weight_events = {h: sum(n for k, n in ev.get(kind, {}).items() if k.endswith(".safetensors"))
                     for h, ev in rerun["inotify"].items() for kind in ("open", "access")}
    return {
        "main": main_label,
        "per_variant": per,
        "cold_rate_Bps": total / t_cold, "cold_vs_L": total / t_cold / lim,
        "second_vs_cold": per[main_label]["second_vs_cold"],
        "rerun_wall_vs_cold_wall": rerun["wall_s"] / runs[main_label]["cold"]["wall_s"],
        "rerun_inspect_vs_cold_stage": max(v["elapsed_s"] for v in rerun["inspect"].values()) / t_cold,
        "rerun_weight_bytes_read": {h: v["weight_bytes_read"] for h, v in rerun["inspect"].items()},
        "rerun_inotify_weight_file_events": weight_events,
        "fanout_b_vs_a": fan["stage"]["b300b"]["elapsed_s"] / fan["stage"]["b300a"]["elapsed_s"],
        "fanout_b_vs_cold": fan["stage"]["b300b"]["elapsed_s"] / t_cold,
        "fanout_source_bytes_vs_model": (fan["served_by_controller"].get(BIG, {}).get("bytes", 0)
                                         + fan["served_by_controller"].get(DRAFT, {}).get("bytes", 0)) / total,
        "alt_vs_stage": (alt["bytes"] / alt["s"]) / (total / t_cold),
    }


if __name__ == "__main__":
    main()
