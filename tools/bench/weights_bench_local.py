"""tools/bench/weights_bench.py --local [--gib 16] [--parallel-files 2,4,8] [--dir DIR] [--w-gib 8] [--shard-gib X]
                                                                     (a benchmark, not a test; issue 40 part 2)

The weights stage on ONE machine: source, stage and limits on the same host, no containers, no SSH, so it runs on
the lent GPU machine (tools/device/weights_bench_run.sh) as well as on the controller. Per value of
model_weights_parallel_files P (--parallel-files, in this run, in this order):

  W(P)   disk write into the stage's target file system (DIR/models' file system), P writers at once, --w-gib in all,
         unique random 16 MiB blocks, fdatasync: twice, at the end only and with the stage's write-behind (the
         sandbox mode's W_SCRIPT, run here): the faster of the two
  N(P)   the transport alone: P curls at once of the P largest shards from the stage's own byte-range server
         (module_utils/weights/model_weights_io.py WeightsServer, the code the controller's server runs) on this machine's
         address (over its loopback device), into /dev/null
  H(P)   sha256, P threads at once over 16 MiB buffers
  L(P)   min(W(P), N(P), H(P))
  stage  playbooks/weights.yml as production runs it (connection local against a temp inventory: one host that is
         its own controller, the sandbox's group_vars, the kimi_k3 profile's two directories), path source on the
         controller served by the stage's controller server on this machine's address (the module's own serve
         mode), target DIR/models emptied before, source read through before: the stage module's own elapsed time;
         rate = model bytes / that time; ratio = rate / L(P)
  cpu    the machine's busy cores (/proc/stat, 0.5 s samples) through the playbook, and the CPU seconds per GB each
         limit figure cost on its own (W, N with the server, H): their sum is what one staged byte costs at least,
         so cores / that sum is the ceiling the cores allow when free (an estimate: the stage's pipe copy is not in
         it); and min(W, 1/(1/N + 1/H)): N and H both need CPU, on shared cores one byte costs the time of both

The model: DIR/src (the sandbox mode's shape: safetensors shards of 1-2 GiB, index, config, tokenizer, --gib in all,
+ the 64 MiB draft; --shard-gib: shards of that size, for a small model that still has P shards; the stage stages
the model directories one after the other, so P streams need P shards in the big one), generated once per size with
all cores. The run needs about 2 x --gib + --w-gib free on DIR's
file system and root (the stage chowns; ansible_become is off when already root). Writes the result after every P
(a run cut short keeps what it measured): artifacts/bench/weights-local-<UTC>.json or --out.
"""
import fcntl
import json
import os
import pathlib
import resource
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time

import weights_bench as wb   # the sandbox mode: the model, the W/N/H scripts, the run's parser

mw, mio = wb.mw, wb.mio
ROOT = wb.ROOT
TOKEN = "bench-local-token-0123456789abcdef"


def free_port(addr):
    s = socket.socket()
    s.bind((addr, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def child_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def local_script(script, *args, timeout=1800):
    """python3 SCRIPT here (the sandbox mode runs the same on a host): its JSON, plus the CPU seconds it used."""
    c0 = child_cpu()
    r = subprocess.run([sys.executable, "-", *args], input=script, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit("bench script failed (rc %d): %s" % (r.returncode, r.stderr[-2000:]))
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["cpu_s"] = round(child_cpu() - c0, 3)
    out["rate_Bps"] = out["bytes"] / out["s"]
    return out


class CpuSampler:
    """Busy cores of the whole machine every `every` seconds: /proc/stat's user, nice, system, irq and softirq
    (proc(5); guest time is inside user already, steal is time the machine did not get)."""

    def __init__(self, every=0.5):
        self.every, self.samples, self.stop_ev = every, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    @staticmethod
    def read():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        return v[0] + v[1] + v[2] + v[5] + v[6], time.monotonic()

    def run(self):
        hz = os.sysconf("SC_CLK_TCK")
        busy0, t0 = self.read()
        while not self.stop_ev.wait(self.every):
            busy, t = self.read()
            self.samples.append((busy - busy0) / hz / (t - t0))
            busy0, t0 = busy, t

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop_ev.set()
        self.thread.join()

    def summary(self):
        s = sorted(self.samples)
        if not s:
            return {}
        return {"mean": round(sum(s) / len(s), 2), "p90": round(s[int(0.9 * (len(s) - 1))], 2), "max": round(s[-1], 2),
                "cpu_s": round(sum(s) * self.every, 1)}


def my_address():
    """An address of this machine that is not loopback: the plan refuses a loopback sglang_advertise_address and
    model_weights_controller_address (rule of a data-network address). Traffic to a machine's own address goes over
    its loopback device all the same (the kernel's local route table)."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    except OSError:   # no hostname(1): each interface's IPv4 address (SIOCGIFADDR, linux/sockios.h 0x8915)
        out = []
        for _i, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sk:
                try:
                    out.append(socket.inet_ntoa(fcntl.ioctl(sk.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))[20:24]))
                except OSError:
                    continue
    addrs = [x for x in out if ":" not in x and not x.startswith("127.")]
    if not addrs:
        raise SystemExit("local bench: this machine has no IPv4 address but loopback (hostname -I: %r); the plan "
                         "refuses a loopback controller address; fix: bring up an interface with an address" % out)
    return addrs[0]


def inventory(work, addr):
    """One host, its own controller: connection local, this Python, the sandbox's group_vars (as
    tests/integration/test_nic_firmware_update_local.py builds its local inventory)."""
    inv = work / "inventory"
    shutil.rmtree(inv, ignore_errors=True)
    shutil.copytree(ROOT / "inventory" / "sandbox" / "group_vars", inv / "group_vars")
    host = {"ansible_connection": "local", "ansible_host": addr, "ansible_python_interpreter": sys.executable}
    if os.geteuid() == 0:
        host["ansible_become"] = False   # already root: the same result without sudo (absent on the GPU machine)
    (inv / "hosts.yml").write_text(json.dumps({"all": {"children": {
        "gpu_nodes": {"hosts": {"b300a": host}}, "sglang_router": {"hosts": {"b300a": None}}}}}, indent=1))
    return inv


def local_playbook(inv, extra, label, logs):
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1", ANSIBLE_CALLBACK_PLUGINS=str(ROOT / "tools/bench/callback_plugins"),
               ANSIBLE_CALLBACKS_ENABLED="bench_results", BENCH_RESULTS_FILE=str(logs / (label + ".json")))
    pb = shutil.which("ansible-playbook") or str(pathlib.Path(sys.executable).parent / "ansible-playbook")
    argv = [pb, "playbooks/weights.yml", "-i", str(inv), "-l", "b300a", "-e", json.dumps(extra)]
    t0 = time.time()
    with CpuSampler() as cpu, open(logs / (label + ".log"), "w") as log:
        r = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=3600)
    wall = time.time() - t0
    path = logs / (label + ".json")
    if r.returncode != 0 or not path.exists():
        raise SystemExit("%s failed (rc %d), see %s: %s" % (label, r.returncode, logs / (label + ".log"),
                                                            (logs / (label + ".log")).read_text()[-3000:]))
    out = dict(wb.parse_run(json.loads(path.read_text())), label=label, wall_s=round(wall, 2),
               busy_cores=cpu.summary())
    if not out["stage"].get("b300a") or out["stage"]["b300a"].get("errors"):
        raise SystemExit("%s: the stage did not finish cleanly: %s" % (label, out["stage"]))
    return out


def warm(src, names):
    for n in names:
        with open(src / wb.BIG / n, "rb") as fh:
            while fh.read(64 << 20):
                pass


def fs_of(path):
    r = subprocess.run(["df", "--output=source,fstype,target", str(path)], capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1].split() if r.returncode == 0 else []


def run_local(a):
    """The local bench (see the module docstring): per --parallel-files value P, the limits W, N and H with P streams
    and the stage with P files at once, one row each, written after every row; the best P at the end."""
    t_start = time.time()
    work = pathlib.Path(a.dir or ROOT / ".cache" / "weights-bench-local").resolve()
    work.mkdir(parents=True, exist_ok=True)
    src, man, target, logs = work / "src", work / "manifests", work / "models", work / "logs"
    cores = os.cpu_count()
    cores_usable = len(os.sched_getaffinity(0))
    pars = [int(x) for x in a.parallel_files.split(",") if x.strip()]
    w_total = int(a.w_gib * wb.GIB) // (16 << 20) * (16 << 20)
    need = 2 * a.gib * wb.GIB + w_total + (1 << 30)
    if not (src / wb.BIG).exists() and shutil.disk_usage(work).free < need:
        raise SystemExit("local bench: %s has %.1f GiB free, the run needs %.1f GiB (2 x --gib %s + --w-gib %s + 1); "
                         "fix: a smaller --gib or another --dir" % (work, shutil.disk_usage(work).free / wb.GIB,
                                                                     need / wb.GIB, a.gib, a.w_gib))
    t_gen = time.time()
    wb.generate(a.gib, cache=work, workers=cores_usable, shard_gib=a.shard_gib)
    t_gen = time.time() - t_gen
    files = mw.parse_manifest((man / (wb.BIG + ".json")).read_text(), "big")
    draft = mw.parse_manifest((man / (wb.DRAFT + ".json")).read_text(), "draft")
    total = mw.total_bytes(files) + mw.total_bytes(draft)
    shards = sorted((n for n in files if n.endswith(".safetensors")), key=lambda n: -files[n]["size"])
    logs.mkdir(exist_ok=True)
    addr = my_address()
    inv = inventory(work, addr)
    port = free_port(addr)
    res = {"mode": "local", "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
           "cores": cores, "cores_usable": cores_usable, "host": socket.gethostname(),
           "kernel": os.uname().release, "address": addr, "mem_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
           "load_before": os.getloadavg(), "target_fs": fs_of(work),
           "model": {"bytes": total, "files": len(files) + len(draft), "shards": sorted(files[n]["size"] for n in shards),
                     "generate_s": round(t_gen, 1)},
           "w_bytes": w_total, "parallel_files": pars, "runs": []}
    out = pathlib.Path(a.out) if a.out else ROOT / "artifacts" / "bench" / ("weights-local-%s.json" % time.strftime(
        "%Y%m%dT%H%M%SZ", time.gmtime(t_start)))
    out.parent.mkdir(parents=True, exist_ok=True)
    print("local: %d cores (%d usable), %s %s; model %s in %d files (generated/reused in %.0f s)" % (
        cores, cores_usable, " ".join(res["target_fs"][:2]), work, mw.human(total), res["model"]["files"], t_gen),
        flush=True)
    print("%3s %9s %9s %9s %9s %9s %-2s %8s %9s %6s %7s %s" % (
        "P", "W_end", "W_behind", "N", "H", "L", "", "stage_s", "stage", "ratio", "fsync_s", "busy cores mean/max"),
        flush=True)
    base = {"sglang_model_root": str(target), "model_weights_manifest_dir": str(man),
            "model_weights_source": {"type": "path", "where": "controller", "path": str(src)},
            "model_weights_controller_address": addr, "model_weights_serve_port": port,
            "model_weights_run_dir": str(work / "run"), "model_weights_reserve_gib": 0,
            "model_weights_protect_home": False, "model_weights_group": "root", "model_weights_progress_s": 5,
            "host_lock_path": str(work / "lock" / "host.lock"), "sglang_gather_hw_facts": False}
    ctx = {"work": work, "src": src, "target": target, "logs": logs, "shards": shards, "files": files, "addr": addr,
           "port": port, "w_total": w_total, "inv": inv, "base": base, "total": total, "cores_usable": cores_usable}
    for p in pars:
        w, n, h = limits_at(p, ctx)
        row, cpb = stage_at(p, ctx, w, n, h)
        res["runs"].append(row)
        res["elapsed_s"] = round(time.time() - t_start, 1)
        out.write_text(json.dumps(res, indent=1))
        print_row(row, cpb, cores_usable)
    shutil.rmtree(target, ignore_errors=True)
    best = max(res["runs"], key=lambda r: r["stage_rate_Bps"])
    res["best"] = {"parallel_files": best["parallel_files"], "stage_rate_Bps": best["stage_rate_Bps"],
                   "ratio": best["ratio"]}
    res["elapsed_s"] = round(time.time() - t_start, 1)
    out.write_text(json.dumps(res, indent=1))
    print("best: model_weights_parallel_files %d, %.0f MB/s = %.2f x its L; run %.0f s; written %s" % (
        best["parallel_files"], best["stage_rate_Bps"] / 1e6, best["ratio"], res["elapsed_s"], out), flush=True)
    if a.clean:
        shutil.rmtree(work, ignore_errors=True)


def limits_at(p, ctx):
    """W (end and write-behind), N (curl from the local weights server) and H (sha256) with p streams."""
    work, src, target, shards, files = ctx["work"], ctx["src"], ctx["target"], ctx["shards"], ctx["files"]
    addr, port, w_total = ctx["addr"], ctx["port"], ctx["w_total"]
    shutil.rmtree(target, ignore_errors=True)
    per = max(16 << 20, w_total // p // (16 << 20) * (16 << 20))
    w = {mode: local_script(wb.W_SCRIPT, str(work / "wtest"), str(per), str(p), mode) for mode in ("end", "behind")}
    shutil.rmtree(work / "wtest", ignore_errors=True)
    warm(src, shards)
    srv = mio.WeightsServer(addr, port, TOKEN, [{"rel": wb.BIG, "names": set(files), "root": str(src)}],
                            kind="source")
    srv.start()
    try:
        urls = [mio.url_for("http://%s:%d/v1/files" % (addr, port), wb.BIG, shards[i % len(shards)])
                for i in range(p)]
        c0 = time.process_time()
        n = local_script(wb.N_SCRIPT, TOKEN, *urls)
        n["server_cpu_s"] = round(time.process_time() - c0, 3)
    finally:
        srv.stop()
    h = local_script(wb.H_SCRIPT, str(min(wb.GIB, max(256 << 20, w_total // p))), str(p))
    return w, n, h


def stage_at(p, ctx, w, n, h):
    """The stage with p files at once, against the limits w, n, h: its row (rate, ratios, CPU bounds) and the CPU
    seconds per byte of W, N and H."""
    src, target, shards, total = ctx["src"], ctx["target"], ctx["shards"], ctx["total"]
    cores_usable = ctx["cores_usable"]
    w_best = max(w["end"]["rate_Bps"], w["behind"]["rate_Bps"])
    lim = min(w_best, n["rate_Bps"], h["rate_Bps"])
    bound = "W" if lim == w_best else ("N" if lim == n["rate_Bps"] else "H")
    # CPU seconds per byte of each figure alone; what one staged byte costs at least (the server and curl, the
    # hash, the write), so the cores allow at most cores / that
    cpb = {"W": w["behind"]["cpu_s"] / w["behind"]["bytes"], "N": (n["cpu_s"] + n["server_cpu_s"]) / n["bytes"],
           "H": h["cpu_s"] / h["bytes"]}
    cpu_ceiling = cores_usable / sum(cpb.values())
    # N and H are both CPU (curl + the server, sha256): on cores they share with each other (and with anything
    # else running) one byte takes 1/N + 1/H of the time they had alone; the disk overlaps (an estimate)
    shared = min(w_best, 1 / (1 / n["rate_Bps"] + 1 / h["rate_Bps"]))
    # the stage
    shutil.rmtree(target, ignore_errors=True)
    warm(src, shards)
    load = os.getloadavg()
    extra = dict(ctx["base"], model_weights_parallel_files=p)
    run = local_playbook(ctx["inv"], extra, "stage-p%d" % p, ctx["logs"])
    st = run["stage"]["b300a"]
    rate = total / st["elapsed_s"]
    row = {"parallel_files": p, "streams_at_most": min(p, len(shards)), "W_end": w["end"], "W_behind": w["behind"], "N": n, "H": h,
           "L": {"rate_Bps": lim, "bound_by": bound, "method": "min(max(W_end, W_behind), N, H), P streams each"},
           "cpu_s_per_GB": {k: round(v * 1e9, 3) for k, v in cpb.items()},
           "cpu_ceiling_Bps": cpu_ceiling, "ceiling_Bps": min(lim, cpu_ceiling),
           "shared_cores_bound_Bps": shared,
           "stage": st, "stage_rate_Bps": rate, "ratio": rate / lim, "ratio_vs_ceiling": rate / min(lim, cpu_ceiling),
           "ratio_vs_shared_bound": rate / shared,
           "stage_wall_s": run["wall_s"], "busy_cores": run["busy_cores"], "load_before_stage": load,
           # the whole machine's CPU through the playbook (Ansible and anything else running included) per GB:
           # an upper bound of what the stage itself spent
           "machine_cpu_s_per_GB_playbook": round(run["busy_cores"].get("cpu_s", 0) / total * 1e9, 2),
           "served_by_controller": run["served_by_controller"]}
    return row, cpb


def print_row(row, cpb, cores_usable):
    """One line of the table, and the CPU line under it."""
    st, bc, lim = row["stage"], row["busy_cores"], row["L"]["rate_Bps"]
    rate, shared, ceiling = row["stage_rate_Bps"], row["shared_cores_bound_Bps"], row["cpu_ceiling_Bps"]
    print("%3d %9.0f %9.0f %9.0f %9.0f %9.0f %-2s %8.1f %9.0f %6.2f %7.2f %s/%s" % (
        row["parallel_files"], row["W_end"]["rate_Bps"] / 1e6, row["W_behind"]["rate_Bps"] / 1e6,
        row["N"]["rate_Bps"] / 1e6, row["H"]["rate_Bps"] / 1e6, lim / 1e6, row["L"]["bound_by"], st["elapsed_s"],
        rate / 1e6, rate / lim, st.get("fsync_s") or 0, bc.get("mean"), bc.get("max")), flush=True)
    print("    cpu s/GB W %.2f N %.2f H %.2f -> %d free cores allow %.0f MB/s (min(L, that) %.0f MB/s, stage %.2f "
          "of it); N and H on shared cores: min(W, 1/(1/N+1/H)) %.0f MB/s, stage %.2f of it; writeback %s" % (
              cpb["W"] * 1e9, cpb["N"] * 1e9, cpb["H"] * 1e9, cores_usable, ceiling / 1e6,
              min(lim, ceiling) / 1e6, rate / min(lim, ceiling), shared / 1e6, rate / shared,
              ",".join(st.get("writeback") or [])), flush=True)
