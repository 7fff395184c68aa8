"""Command-line front ends of the emulated tools (SYNTHESIZED hardware; see README.md).

Each script in bin/ calls ``main(<tool name>, argv)``. The emulator root is the parent of bin/ (normally
/opt/hwemu), or $HWEMU_ROOT. Files there: ``scenario`` (current scenario name), ``sys`` (symlink to
``trees/<scenario>``), ``state/`` (invocation counter, gpu_burn load), ``trees/`` (rendered sysfs trees).
"""
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

# model.py and scenarios.py sit next to this file (on the hosts: /opt/hwemu)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fwtools
import hoststack
import model
import scenarios

HERE = os.path.dirname(os.path.abspath(__file__))


# --------------------------------------------------------------------------------------------- environment
def root_dir():
    return os.environ.get("HWEMU_ROOT") or HERE


def state_dir():
    d = os.path.join(root_dir(), "state")
    os.makedirs(d, exist_ok=True)
    return d


def current_scenario():
    try:
        with open(os.path.join(root_dir(), "scenario")) as fh:
            name = fh.read().strip()
    except OSError:
        name = "healthy"
    return name or "healthy"


def hostname():
    return os.environ.get("HWEMU_HOSTNAME") or socket.gethostname().split(".")[0]


def time_scale():
    try:
        return float(os.environ.get("HWEMU_TIME_SCALE", "1"))
    except ValueError:
        return 1.0


# --------------------------------------------------------------------------------------------- boot realism
# A real HGX host after a power cycle: nvidia_uvm is not loaded until something loads it (nvidia-modprobe -u, or
# /etc/modules-load.d), and the fabric state stays "In Progress" until nvidia-fabricmanager has configured the NVLink
# fabric (CUDA fails with error 802 meanwhile). Both are emulated per container boot: /run is a tmpfs that a restart
# empties, and the boot time is the start time of PID 1.
def run_dir():
    return os.environ.get("HWEMU_RUN_DIR") or "/run/hwemu"


def uvm_loaded():
    return os.path.exists(os.path.join(run_dir(), "nvidia-uvm"))


def fabric_delay_s():
    """Seconds after boot until the fabric state reads Completed: $HWEMU_FABRIC_DELAY_S, <root>/fabric_delay_s, 8."""
    v = os.environ.get("HWEMU_FABRIC_DELAY_S")
    if v is None:
        try:
            with open(os.path.join(root_dir(), "fabric_delay_s")) as fh:
                v = fh.read().strip()
        except OSError:
            v = "8"
    try:
        return float(v)
    except ValueError:
        return 8.0


def boot_age_s():
    """Seconds since this (container) host booted: now minus the start time of PID 1; large when unreadable."""
    try:
        with open("/proc/1/stat") as fh:
            start_ticks = float(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 1e9


def boot_epoch():
    """When this (container) host booted, in epoch seconds."""
    return time.time() - boot_age_s()


def fabric_state():
    return "Completed" if boot_age_s() >= fabric_delay_s() else "In Progress"


def nvidia_modprobe(argv):
    """Stand-in for the setuid nvidia-modprobe: `-u` loads nvidia_uvm (creates <run_dir>/nvidia-uvm); -c=N accepted."""
    if not any(a in ("-u", "--unified-memory") for a in argv):
        return None
    if os.geteuid() != 0:
        die("nvidia-modprobe: cannot load nvidia-uvm: Operation not permitted (emulated: not root)", 1)
    os.makedirs(run_dir(), exist_ok=True)
    with open(os.path.join(run_dir(), "nvidia-uvm"), "w") as fh:
        fh.write("loaded %d\n" % int(time.time()))
    return None


def read_load():
    try:
        with open(os.path.join(state_dir(), "load.json")) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def hoststack_view():
    """The host's installed NVIDIA stack (hoststack.py), or None on a host whose stack dpkg never saw."""
    return hoststack.view(run_dir(), root_dir())


def load_state():
    name = current_scenario()
    if name in scenarios.REAL_SCENARIOS:
        return None
    st = model.build_state(name, hostname())
    st["fabric_state"] = fabric_state()
    hs = hoststack_view()
    if hs is not None:       # the installed stack decides driver and fabric (hoststack.py); else the scenario does
        hoststack.apply(st, hs, fabric_delay_s())
    fwtools.apply_fw_state(st, root_dir(), boot_epoch())   # burned / activated firmware (fwtools.py)
    ld = read_load()
    if ld:
        now = time.time()
        emu = dict(ld)
        emu["start"] = 0.0
        emu["duration"] = ld["duration"]
        model.apply_load(st, emu, (now - ld["start"]) / ld.get("scale", 1.0))
    return st


def real_file(name):
    with open(os.path.join(model.REAL_1X, name)) as fh:
        return fh.read()


def out(text):
    sys.stdout.write(text)
    sys.stdout.flush()


def die(msg, rc=1):
    sys.stderr.write(msg.rstrip("\n") + "\n")
    sys.exit(rc)


def now_stamp():
    return time.strftime("%a %b %d %H:%M:%S %Y")


# --------------------------------------------------------------------------------------------- nvidia-smi
def _select_gpus(st, spec):
    if spec is None:
        return None
    sel = set()
    for part in spec.split(","):
        part = part.strip()
        found = False
        for g in st["gpus"]:
            bid = "00000000:%02X:00.0" % g["bus"]
            if part == str(g["index"]) or part == g["uuid"] or part.upper() in (bid, bid[4:]):
                sel.add(g["index"])
                found = True
        if not found:
            die("No devices were found" if part.isdigit() else "Invalid device id: %s" % part, 6)
    return sel


def _opt_value(argv, i, name):
    a = argv[i]
    if "=" in a and a.startswith("--"):
        return a.split("=", 1)[1], i
    if i + 1 >= len(argv):
        die("Option %s requires a value" % name, 2)
    return argv[i + 1], i + 1


def nvidia_smi(argv):
    real = current_scenario() in scenarios.REAL_SCENARIOS
    st = None if real else load_state()
    if st is not None and st.get("hoststack") is not None:
        err = hoststack.smi_error(hoststack_view())
        if err:      # no module loaded, userspace != module, proprietary modules on Blackwell (hoststack.py)
            sys.stdout.write(err[0])
            sys.exit(err[1])
    sub = argv[0] if argv and not argv[0].startswith("-") else None
    if sub == "topo":
        if real:
            return out(real_file("topo-p2p.txt" if any(a.startswith("-p2p") for a in argv) else "topo.txt"))
        if "-m" in argv or "--matrix" in argv:
            return out(model.render_topo(st))
        die("topo: only -m / --matrix is emulated", 2)
    if sub == "nvlink":
        only = None
        rest = argv[1:]
        if "-i" in rest:
            only = _select_gpus(st, rest[rest.index("-i") + 1]) if st else None
        if "-s" in rest or "--status" in rest:
            return out("" if real else model.render_nvlink_status(st, only))
        die("nvlink: only -s / --status [-i N] is emulated", 2)
    if sub == "dmon":
        return dmon(argv[1:], real, st)
    if sub is not None:
        die("nvidia-smi: subcommand %r is not emulated" % sub, 2)

    query = fmt = gpu_sel = outfile = None
    xml = q = listing = False
    loop_s = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-q", "--query"):
            q = True
        elif a in ("-x", "--xml-format"):
            xml = True
        elif a in ("-L", "--list-gpus"):
            listing = True
        elif a.startswith("--query-gpu"):
            query, i = _opt_value(argv, i, "--query-gpu")
        elif a.startswith("--format"):
            fmt, i = _opt_value(argv, i, "--format")
        elif a in ("-i", "--id") or a.startswith("--id="):
            gpu_sel, i = _opt_value(argv, i, "-i")
        elif a in ("-l", "--loop") or a.startswith("--loop="):
            v, i = _opt_value(argv, i, "-l")
            loop_s = float(v)
        elif a in ("-lms", "--loop-ms") or a.startswith("--loop-ms="):
            v, i = _opt_value(argv, i, "-lms")
            loop_s = float(v) / 1000.0
        elif a in ("-f", "--filename") or a.startswith("--filename="):
            outfile, i = _opt_value(argv, i, "-f")
        elif a in ("-d", "--display"):
            i += 1  # section filter accepted, full output printed
        elif a in ("-h", "--help"):
            return out("NVIDIA System Management Interface -- hwemu stand-in (SYNTHESIZED hardware)\n")
        else:
            die("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.", 2)
        i += 1
    only = _select_gpus(st, gpu_sel) if st else None

    def emit(text):
        if outfile:
            with open(outfile, "w") as fh:
                fh.write(text)
        else:
            out(text)

    if query:
        if real:
            names = [x.strip() for x in query.split(",")]
            cap = real_file("query.csv")
            hdr = [c.split(" [")[0] for c in cap.splitlines()[0].split(", ")]
            if names == hdr and fmt and "noheader" not in fmt:
                return emit(cap)
            capn = real_file("query-noheader.csv")
            if fmt and "noheader" in fmt and names == ["index", "name", "pci.bus_id", "temperature.gpu"]:
                return emit(capn)
            die("h200_real: only the captured --query-gpu field lists are replayed", 2)
        if not fmt:
            die('"--format" is required together with "--query-gpu"', 2)
        count = 0
        while True:
            try:
                emit(model.render_query(st, query, [x.strip() for x in fmt.split(",")], only))
            except model.QueryError as e:
                die(str(e), 2)
            count += 1
            if loop_s is None:
                return None
            mx = os.environ.get("HWEMU_MAX_LOOPS")
            if mx and count >= int(mx):
                return None
            time.sleep(loop_s)
            st = load_state()
            fmt_noheader = fmt if "noheader" in fmt else fmt + ",noheader"
            fmt = fmt_noheader
    if listing:
        return emit(real_file("smi-L.txt") if real else model.render_L(st))
    if q and xml:
        return emit(real_file("q.xml") if real else model.render_xml(st, now_stamp(), only))
    if q:
        return emit(real_file("q.txt") if real else model.render_q_text(st, now_stamp(), only))
    if xml:
        die("-x requires -q", 2)
    return emit(real_file("smi.txt") if real else model.render_smi_table(st, now_stamp()))


def dmon(argv, real, st):
    groups, count, delay, sel = "puc", None, 1.0, None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "-s":
            groups = argv[i + 1]
            i += 1
        elif a == "-c":
            count = int(argv[i + 1])
            i += 1
        elif a == "-d":
            delay = float(argv[i + 1])
            i += 1
        elif a == "-i":
            sel = argv[i + 1]
            i += 1
        elif a in ("-o", "-f", "--format"):
            i += 1
        else:
            die("dmon: option %s is not emulated" % a, 2)
        i += 1
    if real:
        return out(real_file("dmon-s.txt" if groups != "puc" else "dmon.txt"))
    only = _select_gpus(st, sel)
    h1, h2, _ = model.dmon_header(groups)
    out(h1 + "\n" + h2 + "\n")
    n = 0
    while count is None or n < count:
        out("\n".join(model.dmon_rows(st, groups, only)) + "\n")
        n += 1
        if count is not None and n >= count:
            break
        mx = os.environ.get("HWEMU_MAX_LOOPS")
        if mx and n >= int(mx):
            break
        time.sleep(delay)
        st = load_state()
    return None


# --------------------------------------------------------------------------------------------- RDMA tools
def _no_rdma(tool):
    die("%s: command not available on this host (scenario h200_real has no RDMA stack)" % tool, 127)


def ibstat(argv):
    st = load_state()
    if st is None:
        _no_rdma("ibstat")
    args = [a for a in argv if not a.startswith("-")]
    if "-l" in argv or "--list_of_cas" in argv:
        return out("".join(n["name"] + "\n" for n in st["nics"]))
    if "-p" in argv or "--port_list" in argv:
        sel = [n for n in st["nics"] if not args or n["name"] == args[0]]
        return out("".join("0x%s\n" % n["guid"] for n in sel))
    if args and model.find_nic(st, args[0]) is None:
        die("ibpanic: [%d] main: stat of IB device '%s' failed: No such file or directory" % (os.getpid(), args[0]))
    return out(model.render_ibstat(st, [args[0]] if args else None))


def ibv_devinfo(argv):
    st = load_state()
    if st is None:
        die("No IB devices found", 255)
    if "-l" in argv or "--list" in argv:
        return out("%d HCAs found:\n" % len(st["nics"]) + "".join("\t%s\n" % n["name"] for n in st["nics"]))
    only = None
    for i, a in enumerate(argv):
        if a in ("-d", "--ib-dev"):
            only = [argv[i + 1]]
        elif a.startswith("--ib-dev="):
            only = [a.split("=", 1)[1]]
    if only and model.find_nic(st, only[0]) is None:
        die("IB device '%s' wasn't found" % only[0], 255)
    return out(model.render_ibv_devinfo(st, only))


def mlxfwmanager(argv, tool="mlxfwmanager"):
    st = load_state()
    if st is None:
        _no_rdma(tool)
    if not any(a in ("--query", "-q") for a in argv):
        die("%s: only --query is emulated (no burning in the sandbox)" % tool, 2)
    text = model.render_mlxfwmanager(st)
    dev = None
    for i, a in enumerate(argv):
        if a in ("-d", "--dev"):
            dev = argv[i + 1]
    if dev:
        n = model.find_nic(st, dev)
        if n is None:
            die("-E- Device %s not found" % dev, 1)
        one = dict(st)
        one["nics"] = [n]
        text = model.render_mlxfwmanager(one)
    return out(text)


def ofed_info(argv):
    st = load_state()
    if st is None:
        _no_rdma("ofed_info")
    if "-s" in argv:
        return out(model.render_ofed_info(st))
    if "-n" in argv:
        return out(st["ofed_version"] + "\n")
    return out(model.render_ofed_info(st) + "-------------------\n\nInstalled packages:\n-------------------\n"
               "doca-ofed\nmlnx-ofed-kernel-dkms\nrdma-core\nibverbs-utils\ninfiniband-diags\nmft\n")


def modinfo(argv):
    st = load_state()
    field = kernel = None
    mods = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-F", "--field"):
            field = argv[i + 1]
            i += 1
        elif a in ("-k", "--set-version"):
            kernel = argv[i + 1]
            i += 1
        elif a.startswith("--field="):
            field = a.split("=", 1)[1]
        elif a.startswith("-"):
            pass
        else:
            mods.append(a)
        i += 1
    if not mods:
        die("modinfo: ERROR: missing module or filename.", 1)
    if st is not None and st.get("hoststack") is not None:
        return modinfo_installed(mods, field, kernel or hoststack.running_kernel())
    rc = 0
    for m in mods:
        if m == "mlx5_core" and st is not None:
            f = model.modinfo_fields(st)
            text = model.render_modinfo(st)
        elif m == "nvidia":
            drv = st["driver_version"] if st else "580.159.04"
            kern = st["kernel"] if st else model.KERNEL
            f = {"filename": "/lib/modules/%s/updates/dkms/nvidia.ko" % kern, "version": drv,
                 "license": "Dual MIT/GPL", "depends": "", "name": "nvidia"}
            text = "".join("%-15s %s\n" % (k + ":", v) for k, v in f.items())
        else:
            sys.stderr.write("modinfo: ERROR: Module %s not found.\n" % m)
            rc = 1
            continue
        if field:
            if field in f:
                out(f[field] + "\n")
        else:
            out(text)
    sys.exit(rc)


def flint(argv, tool="flint"):
    """flint / mstflint: `-d DEV q`, `-i IMG q`, `-i IMG verify`, `-d DEV -i IMG [-y] burn`, `--version` (formats and
    sources: fwtools.py). Burning refuses a PSID change (no -allow_psid_change emulated) and needs -y (no prompt)."""
    if "--version" in argv or "-v" in argv:
        return out(fwtools.VERSIONS[tool] + "\n")
    st = load_state()
    if st is None:
        _no_rdma(tool)
    dev = img_path = cmd = None
    yes = False
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-d", "--device"):
            dev = argv[i + 1]
            i += 1
        elif a in ("-i", "--image"):
            img_path = argv[i + 1]
            i += 1
        elif a in ("-y", "--yes"):
            yes = True
        elif a in ("query", "q"):
            cmd = "query"
        elif a in ("verify", "v"):
            cmd = "verify"
        elif a in ("burn", "b"):
            cmd = "burn"
        elif a in ("-allow_psid_change", "--allow_psid_change", "-nofs", "--nofs", "-clear_semaphore"):
            die("-E- %s: %s is not emulated (the sandbox never changes a PSID or burns without fail-safe)" % (tool, a), 1)
        i += 1
    if cmd in ("query", "verify") and img_path and dev is None:
        img = fwtools.image(img_path)
        if img is None:
            die("-E- Cannot open %s: not a firmware image this emulator knows (sandbox/hwemu/fwimage.py)" % img_path, 1)
        if cmd == "query":
            return out(fwtools.render_image_query(img))
        text, rc = fwtools.render_verify(img)
        out(text)
        sys.exit(rc)
    if dev is None:
        die("-E- Missing device argument (-d)", 1)
    n = model.find_nic(st, dev)
    if n is None:
        die("-E- Cannot open Device: %s. No such file or directory. MFE_CR_ERROR" % dev, 1)
    if cmd == "query":
        return out(model.render_flint_query(st, n))
    if cmd == "burn":
        if not img_path:
            die("-E- Missing image argument (-i)", 1)
        if not yes:
            die("-E- %s burn: interactive prompt not emulated, pass -y" % tool, 1)
        so, se, rc = fwtools.burn(root_dir(), st, n, fwtools.image(img_path), boot_epoch(), tool=tool)
        out(so)
        if se:
            sys.stderr.write(se)
        sys.exit(rc)
    die("-E- %s: only query, verify and burn are emulated" % tool, 1)


def mlxfwreset(argv):
    """`mlxfwreset -d DEV query` and `mlxfwreset -d DEV reset [-l N] -y` (formats and CX8 levels: fwtools.py)."""
    if "--version" in argv or "-v" in argv:
        return out(fwtools.VERSIONS["mlxfwreset"] + "\n")
    st = load_state()
    if st is None:
        _no_rdma("mlxfwreset")
    dev = _opt(argv, ("-d", "--device"))
    level = _opt(argv, ("-l", "--level"))
    if dev is None:
        die("-E- Missing device argument (-d)", 1)
    n = model.find_nic(st, dev)
    if n is None:
        die("-E- Device %s not found" % dev, 1)
    if any(a in ("q", "query") for a in argv):
        return out(fwtools.render_reset_query(root_dir(), n))
    if any(a in ("r", "reset") for a in argv):
        if not any(a in ("-y", "--yes") for a in argv):
            die("-E- mlxfwreset reset: interactive prompt not emulated, pass -y", 1)
        so, se, rc = fwtools.reset(root_dir(), n, int(level) if level is not None else None, dev)
        out(so)
        if se:
            sys.stderr.write(se)
        sys.exit(rc)
    die("-E- mlxfwreset: only query and reset are emulated", 1)


# --------------------------------------------------------------------------------------------- nccl-tests
AR_OPTS = {  # short, long, key, kind
    "-t": ("nthreads", int), "--nthreads": ("nthreads", int), "-g": ("ngpus", int), "--ngpus": ("ngpus", int),
    "-b": ("minbytes", "size"), "--minbytes": ("minbytes", "size"), "-e": ("maxbytes", "size"),
    "--maxbytes": ("maxbytes", "size"), "-i": ("stepbytes", "size"), "--stepbytes": ("stepbytes", "size"),
    "-f": ("stepfactor", int), "--stepfactor": ("stepfactor", int), "-n": ("iters", int), "--iters": ("iters", int),
    "-m": ("agg", int), "--agg_iters": ("agg", int), "-w": ("warmup", int), "--warmup_iters": ("warmup", int),
    "-p": ("parallel", int), "--parallel_init": ("parallel", int), "-c": ("check", int), "--check": ("check", int),
    "-o": ("op", str), "--op": ("op", str), "-d": ("dtype", str), "--datatype": ("dtype", str),
    "-r": ("root", int), "--root": ("root", int), "-z": ("blocking", int), "--blocking": ("blocking", int),
    "-y": ("stream_null", int), "--stream_null": ("stream_null", int), "-T": ("timeout", int),
    "--timeout": ("timeout", int), "-G": ("graph", int), "--cudagraph": ("graph", int),
    "-C": ("cputime", int), "--report_cputime": ("cputime", int), "-a": ("average", int), "--average": ("average", int),
    "-R": ("local_register", int), "--local_register": ("local_register", int), "-J": ("json_path", str),
    "--output_file": ("json_path", str), "-N": ("run_cycles", int), "--run_cycles": ("run_cycles", int),
    "-u": ("unalign", int), "--unalign": ("unalign", int),
}
AR_USAGE = ("USAGE: all_reduce_perf [-t,--nthreads <num threads>] [-g,--ngpus <gpus per thread>] "
            "[-b,--minbytes <min size in bytes>] [-e,--maxbytes <max size in bytes>] [-i,--stepbytes <increment size>] "
            "[-f,--stepfactor <increment factor>] [-n,--iters <iteration count>] [-m,--agg_iters <aggregated iteration count>] "
            "[-w,--warmup_iters <warmup iteration count>] [-c,--check <0/1>] [-o,--op <sum/prod/min/max/avg/all>] "
            "[-d,--datatype <nccltype/all>] [-r,--root <root>] [-z,--blocking <0/1>] [-G,--cudagraph <num graph launches>] "
            "[-a,--average <0/1/2/3>] [-J,--output_file <json file>] [-h,--help]\n")


def parse_ar_args(argv):
    # defaults of the real binary: -b 32M -e 32M -i 1M -f 1 -g 1 -w 1 -n 20
    o = model.default_ar_opts(ngpus=1, maxbytes=32 << 20, minbytes=32 << 20, warmup=1, stepfactor=1)
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            out(AR_USAGE)
            sys.exit(0)
        key, val = a, None
        if a.startswith("--") and "=" in a:
            key, val = a.split("=", 1)
        elif a.startswith("-") and not a.startswith("--") and len(a) > 2:
            key, val = a[:2], a[2:]
        if key not in AR_OPTS:
            sys.stderr.write("invalid option '%s'\n" % a)
            sys.stderr.write(AR_USAGE)
            sys.exit(1)
        if val is None:
            if i + 1 >= len(argv):
                die("option %s requires an argument" % a)
            val = argv[i + 1]
            i += 1
        name, kind = AR_OPTS[key]
        try:
            o[name] = model.parse_size(val) if kind == "size" else kind(val)
        except ValueError:
            die("invalid value %r for %s" % (val, a))
        i += 1
    dt = model.TYPE_ALIASES.get(o["dtype"], o["dtype"])
    if dt != "all" and dt not in dict(model.TYPE_SIZES):
        die("Invalid type %s, defaulting to float" % o["dtype"])
    o["dtype"] = dt
    if o["op"] != "all" and o["op"] not in model.OPS:
        die("Invalid reduction %s" % o["op"])
    if o["ngpus"] < 1 or o["ngpus"] * o["nthreads"] > 8:
        die("Error: requested %d GPUs per process, this host has 8" % (o["ngpus"] * o["nthreads"]))
    return o


def _bump_counter(name="nccl_calls"):
    p = os.path.join(state_dir(), name)
    try:
        with open(p) as fh:
            n = int(fh.read().strip() or 0)
    except (OSError, ValueError):
        n = 0
    n += 1
    with open(p, "w") as fh:
        fh.write("%d\n" % n)
    return n


def _ib_hcas(st, env):
    spec = env.get("NCCL_IB_HCA", "")
    data = [n for n in st["nics"] if n["link_layer"] == "InfiniBand"]
    if not spec:
        return data
    exclude = spec.startswith("^")
    exact = spec.lstrip("^").startswith("=")
    pats = [p.split(":")[0] for p in spec.lstrip("^").lstrip("=").split(",") if p]
    match = (lambda name: name in pats) if exact else (lambda name: any(name.startswith(p) for p in pats))
    return [n for n in st["nics"] if (not match(n["name"])) == exclude]


def _nccl_info(st, env, nodes):
    if env.get("NCCL_DEBUG", "").upper() not in ("INFO", "TRACE"):
        return []
    h = st["hostname"]
    pre = "%s:4242:4242 [0] NCCL INFO " % h
    hcas = _ib_hcas(st, env)
    lines = [pre + "cudaDriverVersion 13000", pre + "NCCL version 2.28.9+cuda13.0",
             pre + "NET/Plugin: Could not find: libnccl-net.so"]
    if hcas:
        lines.append(pre + "NET/IB : Using " + " ".join("[%d]%s:1/%s" % (i, n["name"], "IB" if n["link_layer"] == "InfiniBand"
                                                                          else "RoCE") for i, n in enumerate(hcas))
                     + " [RO]; OOB %s:10.89.30.11<0>" % env.get("NCCL_SOCKET_IFNAME", "eth0").lstrip("=^"))
        lines.append(pre + "Initialized NET plugin IB")
    else:
        lines += [pre + "NET/IB : No device found.", pre + "Failed to initialize NET plugin IB",
                  pre + "NET/Socket : Using [0]eth0:10.89.30.11<0>", pre + "Initialized NET plugin Socket"]
    lines.append(pre + "comm 0x5555 rank 0 nRanks %d nNodes %d localRanks 8 localRank 0 MNNVL 0" % (8 * nodes, nodes))
    return lines


def run_all_reduce(argv, nodes=1, env=None, hostnames=None, ranks_per_node=8, prog="all_reduce_perf"):
    env = dict(os.environ if env is None else env)
    o = parse_ar_args(argv)
    o["args"] = [prog] + list(argv)
    if nodes > 1:
        o["ranks_per_node"] = ranks_per_node
    if current_scenario() in scenarios.REAL_SCENARIOS:
        text = real_file("all_reduce_g1.txt")
        if o["json_path"]:
            with open(o["json_path"], "w") as fh:
                fh.write(real_file("ar-g1.json"))
        return out(text)
    st = load_state()
    call = _bump_counter()
    net_only = nodes == 1 and env.get("NCCL_P2P_DISABLE") == "1" and env.get("NCCL_SHM_DISABLE") == "1"
    hcas = [n for n in _ib_hcas(st, env) if n["role"] == "data"] if net_only else []
    if net_only and hcas:
        # one node, NVLink and shared memory off: every byte crosses the NICs (loopback through the switch)
        nic_gbps = sum(min(n["rate_n"], 64.0 * n.get("pcie_width", 16) * 0.92) for n in hcas if n["state"] == "ACTIVE")
        st["nccl"]["peak_1node"] = max(nic_gbps / 8.0 * 0.85, 0.5)
    res = model.all_reduce_run(st, o, nodes=nodes, env=env, hostnames=hostnames, pid=os.getpid())
    lines = res["lines"]
    info = _nccl_info(st, env, nodes)
    hdr_end = lines.index([ln for ln in lines if ln.startswith("#  Rank")][-1]) + 1
    lines = lines[:hdr_end] + info + lines[hdr_end:]
    if hcas:
        _bump_ib_counters([n["name"] for n in hcas], st)
        for n in hcas:
            fault = st["triage"]["traffic"].get(n["name"], {})
            if fault.get("nccl_fail_on_call") and _bump_counter("nccl_calls_" + n["name"]) == fault["nccl_fail_on_call"]:
                status = fault.get("wc_status", 12)
                pre = "%s:%d:%d [0] " % (st["hostname"], os.getpid(), os.getpid() + 7)
                warn = [pre + "transport/net_ib/p2p.cc:648 NCCL WARN NET/IB: Got completion from peer %s<40554> with "
                        "status=IBV_WC_RETRY_EXC_ERR(%d) opcode=IBV_WC_RDMA_WRITE(1) vendor_err=129 hca %s"
                        % ("10.89.30.11", status, n["name"]),
                        pre + "NCCL INFO transport/net.cc:1302 -> 6", pre + "NCCL INFO proxy.cc:698 -> 6",
                        "%s: Test NCCL failure common.cu:1279 'remote process exited or there was a network error / '"
                        % st["hostname"]]
                cut = lines.index([ln for ln in lines if ln.startswith("#        (B)")][0]) + 4
                out("\n".join(lines[:cut] + warn) + "\n")
                sys.exit(3)
    if st["nccl"]["hang_on_call"] and call == st["nccl"]["hang_on_call"]:
        cut = lines.index([ln for ln in lines if ln.startswith("#        (B)")][0]) + 1
        out("\n".join(lines[:cut]) + "\n")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        while True:  # the emulated collective never completes
            time.sleep(3600)
    if o["json_path"]:
        with open(o["json_path"], "w") as fh:
            fh.write(model.dump_json(res["json"]))
    out("\n".join(lines))
    sys.exit(res["rc"])


def mpirun(argv):
    np_, per_node, hosts, env = None, None, [], {}
    i = 0
    noval = {"--allow-run-as-root", "--oversubscribe", "--tag-output", "-tag-output", "--report-bindings",
             "--display-map", "-v", "--verbose", "--quiet", "-q", "--bind-to-core", "--timestamp-output"}
    withval = {"--bind-to", "-bind-to", "--map-by", "-map-by", "--rank-by", "--prefix", "--hostfile", "-hostfile",
               "--machinefile", "-machinefile", "--wdir", "-wdir", "--output-filename"}
    while i < len(argv):
        a = argv[i]
        if a in ("-np", "-n", "--np", "-c"):
            np_ = int(argv[i + 1])
            i += 2
        elif a in ("-N", "-npernode", "--npernode"):
            per_node = int(argv[i + 1])
            i += 2
        elif a in ("-H", "-host", "--host"):
            hosts = [h.split(":")[0] for h in argv[i + 1].split(",") if h]
            i += 2
        elif a == "-x":
            kv = argv[i + 1]
            if "=" in kv:
                k, v = kv.split("=", 1)
            else:
                k, v = kv, os.environ.get(kv, "")
            env[k] = v
            i += 2
        elif a in ("--mca", "-mca", "-gmca", "--gmca"):
            i += 3
        elif a in noval:
            i += 1
        elif a in withval or (a.startswith("--") and "=" in a):
            i += 1 if "=" in a else 2
        elif a.startswith("-"):
            die("mpirun (hwemu stand-in): option %s is not emulated" % a, 1)
        else:
            break
    cmd = argv[i:]
    if not cmd:
        die("mpirun (hwemu stand-in): no executable given", 1)
    hosts = hosts or [hostname()]
    np_ = np_ or (per_node or 1) * len(hosts)
    per_node = per_node or max(1, np_ // len(hosts))
    nodes = max(1, -(-np_ // per_node))
    full_env = dict(os.environ)
    full_env.update(env)
    if os.path.basename(cmd[0]) == "all_reduce_perf":
        if per_node > 8:
            die("mpirun (hwemu stand-in): %d ranks per node but the host has 8 GPUs" % per_node, 1)
        if nodes == 1:
            o_argv = cmd[1:]
            return run_all_reduce(o_argv, nodes=1, env=full_env, prog=cmd[0])
        return run_all_reduce(cmd[1:], nodes=nodes, env=full_env, hostnames=hosts, ranks_per_node=per_node, prog=cmd[0])
    rc = 0
    for r in range(np_):  # other programs: run locally once per rank (the stand-in does not reach other hosts)
        e = dict(full_env, OMPI_COMM_WORLD_RANK=str(r), OMPI_COMM_WORLD_SIZE=str(np_),
                 OMPI_COMM_WORLD_LOCAL_RANK=str(r % per_node))
        rc = subprocess.call(cmd, env=e) or rc
    sys.exit(rc)


# --------------------------------------------------------------------------------------------- gpu_burn
def gpu_burn(argv):
    secs = 10.0
    gpus = None
    for i, a in enumerate(argv):
        if a in ("-h", "--help"):
            return out("GPU Burn (hwemu stand-in, SYNTHESIZED load): gpu_burn [-d] [-tc] [-i N] [-m X%] SECONDS\n")
        if a == "-i":
            gpus = [int(argv[i + 1])]
        elif not a.startswith("-") and (i == 0 or argv[i - 1] not in ("-i", "-m")):
            secs = float(a)
    if current_scenario() in scenarios.REAL_SCENARIOS:
        die("gpu_burn: not emulated for h200_real", 2)
    scale = time_scale()
    ld = {"start": time.time(), "duration": secs, "scale": scale, "gpus": gpus}
    load_file = os.path.join(state_dir(), "load.json")
    with open(load_file, "w") as fh:
        json.dump(ld, fh)

    def _stop(*_):
        # a burner stopped early (SIGTERM from timeout/systemd) takes its load with it
        try:
            os.remove(load_file)
        except OSError:
            pass
        sys.exit(143)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    out("Burning for %d seconds.\n" % secs)
    steps = max(1, int(secs // 10))
    for k in range(1, steps + 1):
        time.sleep(secs * scale / steps)
        st = load_state()
        temps = " - ".join("%d C" % g["temp"] for g in st["gpus"] if gpus is None or g["index"] in gpus)
        out("%.1f%%  proc'd: %s   errors: %s   temps: %s \n" % (
            100.0 * k / steps, " - ".join("%d (%d Gflop/s)" % (k * 1200, 61000 if g["sm_clock"] > 1800 else 38000)
                                          for g in st["gpus"] if gpus is None or g["index"] in gpus),
            " - ".join("0" for g in st["gpus"] if gpus is None or g["index"] in gpus), temps))
    st = load_state()
    try:
        os.remove(os.path.join(state_dir(), "load.json"))
    except OSError:
        pass
    out("\nTested %d GPUs:\n" % len([g for g in st["gpus"] if gpus is None or g["index"] in gpus]))
    for g in st["gpus"]:
        if gpus is None or g["index"] in gpus:
            out("\tGPU %d: OK\n" % g["index"])
    return None


# --------------------------------------------------------------------------------------------- triage stand-ins
REAL_JOURNALCTL = ("/usr/bin/journalctl", "/bin/journalctl")


def _boot_epoch(now):
    # the emulated kernel booted at least 3 h ago, so the scenarios' lines (up to ~2 h old) come after the boot lines
    return now - min(max(boot_age_s(), 3 * 3600.0), 30 * 86400.0)


def _parse_since(text, now):
    """journalctl --since forms the triage and humans use: 'YYYY-MM-DD HH:MM[:SS]', '-2h', '2 hours ago', '@epoch'."""
    t = (text or "").strip()
    if t.startswith("@"):
        return float(t[1:])
    m = re.match(r"^-?(\d+)\s*(s|sec|m|min|h|hour|hours|d|day|days)?(?: ago)?$", t)
    if m:
        mult = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "hours": 3600, "d": 86400, "day": 86400,
                "days": 86400}.get(m.group(2) or "s", 1)
        return now - int(m.group(1)) * mult
    for fmt in ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(t, fmt))
        except ValueError:
            continue
    die("Failed to parse timestamp: %s" % t, 1)


def _kmsg(st):
    now = time.time()
    return model.kmsg_events(st, _boot_epoch(now), now)


def journalctl(argv):
    """`journalctl -k|--dmesg [--since X] [-o short-iso|short] [--no-pager] [-q]`: the emulated kernel ring buffer.
    Anything else goes to the real journalctl (the host's own journal)."""
    if not any(a in ("-k", "--dmesg") for a in argv):
        for real in REAL_JOURNALCTL:
            if os.path.exists(real):
                os.execv(real, [real] + list(argv))
        die("journalctl (hwemu): only -k is emulated and no real journalctl was found", 1)
    st = load_state()
    if st is None:
        return out("-- No entries --\n")
    now = time.time()
    since, fmt = None, "short"
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("--since", "-S") and i + 1 < len(argv):
            since = _parse_since(argv[i + 1], now)
            i += 2
            continue
        if a.startswith("--since="):
            since = _parse_since(a.split("=", 1)[1], now)
        elif a in ("-o", "--output") and i + 1 < len(argv):
            fmt = argv[i + 1]
            i += 2
            continue
        elif a.startswith("--output="):
            fmt = a.split("=", 1)[1]
        i += 1
    host = st["hostname"]
    lines = []
    for ep, text in _kmsg(st):
        if since is not None and ep < since:
            continue
        if fmt == "short-iso":
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(ep))
        else:
            stamp = time.strftime("%b %d %H:%M:%S", time.localtime(ep))
        lines.append("%s %s kernel: %s" % (stamp, host, text))
    return out("\n".join(lines) + "\n" if lines else "-- No entries --\n")


def dmesg(argv):
    """`dmesg [--time-format iso|-T]`: the emulated kernel ring buffer (monotonic stamps by default)."""
    st = load_state()
    if st is None:
        return None
    now = time.time()
    boot = _boot_epoch(now)
    iso = "--time-format" in argv and "iso" in argv
    ctime = "-T" in argv or "--ctime" in argv
    lines = []
    for ep, text in _kmsg(st):
        if iso:
            lines.append("%s,%06d%s %s" % (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ep)), int((ep % 1) * 1e6),
                                           time.strftime("%z", time.localtime(ep))[:3] + ":" + time.strftime("%z", time.localtime(ep))[3:], text))
        elif ctime:
            lines.append("[%s] %s" % (time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(ep)), text))
        else:
            lines.append("[%12.6f] %s" % (ep - boot, text))
    return out("\n".join(lines) + "\n")


def devlink(argv):
    """`devlink [-j] health show` and `devlink health diagnose pci/BDF reporter NAME`."""
    st = load_state()
    as_json = "-j" in argv or "--json" in argv
    args = [a for a in argv if a not in ("-j", "--json", "-p", "--pretty")]
    if st is None:
        die("devlink answers: No such device", 1)
    if args[:2] == ["health", "show"] or args == ["health"]:
        return out(model.render_devlink_health(st, as_json))
    if args[:2] == ["health", "diagnose"] and len(args) >= 5 and args[3] == "reporter":
        text = model.render_devlink_diagnose(st, args[2].replace("pci/", ""), args[4])
        if text is None:
            die("kernel answers: No such device", 1)
        return out(text)
    die("devlink (hwemu stand-in): only `health show` and `health diagnose` are emulated", 1)


def lspci(argv):
    st = load_state()
    bdf = None
    for i, a in enumerate(argv):
        if a == "-s" and i + 1 < len(argv):
            bdf = argv[i + 1]
    if st is None:
        die("lspci (hwemu stand-in): no PCI devices (h200_real)", 1)
    if bdf is None:   # every function, in bus order, a blank line between them (like lspci -vvv)
        return out("\n".join(model.render_lspci_vvv(st, b) for b in sorted(model.pci_layout(st))))
    if len(bdf) == 7:
        bdf = "0000:" + bdf
    text = model.render_lspci_vvv(st, bdf.lower())
    return out(text or "")


def setpci(argv):
    st = load_state()
    bdf = argv[argv.index("-s") + 1] if "-s" in argv else None
    if st is None or bdf is None or not any(a.upper().startswith("ECAP_ACS+0X6") for a in argv):
        die("setpci (hwemu stand-in): only `setpci -s BDF ECAP_ACS+0x6.w` (read) is emulated", 1)
    if any("=" in a for a in argv):
        die("setpci (hwemu stand-in): writes are not emulated", 1)
    devs = model.pci_layout(st)
    d = devs.get(bdf.lower() if len(bdf) > 7 else "0000:" + bdf.lower())
    if d is None or d["kind"] not in ("root_port", "switch_up", "switch_down"):
        die("setpci: Capability ECAP_ACS not found", 1)
    return out("%04x\n" % model.acs_word(st["triage"]["acs"].get(bdf.lower(), ())))


def lsmod(argv):
    st = load_state()
    if st is None:
        return out("Module                  Size  Used by\n")
    if st.get("hoststack") is not None:     # the installed stack's loaded list (hoststack.py)
        return out("Module                  Size  Used by\n" + "".join(
            "%-24s%8s  0\n" % tuple(ln.split()[:2]) for ln in hoststack.proc_modules_text(st["hoststack"]["loaded"])
            .splitlines()))
    return out(model.render_lsmod(st))


def _bump_ib_counters(nic_names, st, fault_key="traffic"):
    """Traffic through these NICs: data counters grow, and the scenario's per-NIC traffic faults are added."""
    tree = os.path.join(root_dir(), "sys")
    for name in nic_names:
        base = os.path.join(tree, "class", "infiniband", name, "ports", "1")
        fault = st["triage"]["traffic"].get(name, {})
        adds = {"counters": dict({"port_xmit_data": 2 ** 31, "port_rcv_data": 2 ** 31}, **fault.get("counters", {})),
                "hw_counters": dict(fault.get("hw_counters", {}))}
        for sub, vals in adds.items():
            for cname, inc in vals.items():
                path = os.path.join(base, sub, cname)
                try:
                    with open(path) as fh:
                        cur = int(fh.read().strip() or 0)
                    with open(path, "w") as fh:
                        fh.write("%d\n" % (cur + inc))
                except (OSError, ValueError):
                    continue


def _opt(argv, names, default=None):
    for i, a in enumerate(argv):
        for n in names:
            if a == n and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
    return default


def ib_write_bw(argv):
    """perftest `ib_write_bw -d DEV [--use_cuda=N] [-s BYTES] [-n ITERS] [-p PORT] [--report_gbits] [-F] [SERVER]`:
    a server (no SERVER argument) waits for one client; the client computes the bandwidth of DEV's port and PCIe link
    (GPUDirect through an ACS-redirecting bridge: ~30 %% of it; --use_cuda without nvidia_peermem: MR fails)."""
    st = load_state()
    if st is None:
        die("ib_write_bw: No IB devices found", 1)
    dev = _opt(argv, ("-d", "--ib-dev"))
    size = int(_opt(argv, ("-s", "--size"), "65536"))
    iters = int(_opt(argv, ("-n", "--iters"), "5000"))
    port = _opt(argv, ("-p", "--port"), "18515")
    cuda = None
    for a in argv:
        if a.startswith("--use_cuda"):
            cuda = int(a.split("=", 1)[1]) if "=" in a else 0
    takes = {"-d", "--ib-dev", "-s", "--size", "-n", "--iters", "-p", "--port", "-x", "--gid-index", "-q", "-m", "-D",
             "--tclass", "-i", "--ib-port"}
    pos = [a for i, a in enumerate(argv) if not a.startswith("-") and (i == 0 or argv[i - 1] not in takes)]
    server = not pos
    nic = next((n for n in st["nics"] if n["name"] == dev), None)
    if nic is None:
        die(" Couldn't get context for the device\n Unable to find the Infiniband/RoCE device", 1)
    rdv = os.path.join(state_dir(), "ibwb-%s-%s" % (dev, port))
    if cuda is not None and not st["triage"]["peermem"]:
        out("initializing CUDA\n")
        die(" Couldn't allocate MR\n failed to create mr\n Failed to create MR", 1)
    if server:
        with open(rdv + ".srv", "w") as fh:
            fh.write("%d\n" % os.getpid())
        deadline = time.time() + 60
        while time.time() < deadline and not os.path.exists(rdv + ".res"):
            time.sleep(0.1)
        try:
            with open(rdv + ".res") as fh:
                gbps = float(fh.read().strip())
            os.remove(rdv + ".res")
        except (OSError, ValueError):
            die(" Couldn't connect to the client (timeout)", 1)
        finally:
            if os.path.exists(rdv + ".srv"):
                os.remove(rdv + ".srv")
        return out(model.perftest_output(st, dev, gbps, size, iters, cuda, True))
    deadline = time.time() + 10
    while time.time() < deadline and not os.path.exists(rdv + ".srv"):
        time.sleep(0.1)
    if not os.path.exists(rdv + ".srv"):
        die("Couldn't connect to %s:%s" % (pos[0], port), 1)
    pcie = 64.0 * nic.get("pcie_width", 16) * 0.92
    gbps = min(nic["rate_n"], pcie) * 0.968
    if cuda is not None:
        bridges = [b for b, bits in st["triage"]["acs"].items() if {"ReqRedir", "CmpltRedir"} & set(bits)]
        dsp = "0000:%02x:01.0" % (nic["bus"] - 1)
        if dsp in bridges:
            gbps *= 0.31
    gbps = round(gbps, 2)
    _bump_ib_counters([dev], st)
    with open(rdv + ".res", "w") as fh:
        fh.write("%s\n" % gbps)
    return out(model.perftest_output(st, dev, gbps, size, iters, cuda, False))


# --------------------------------------------------------------------------------------------- scenario switch
def add_traffic_counters(tree):
    """ports/1/counters/{port_xmit_data,port_rcv_data,...} = 0 (octets / 4, like mlx5) on every emulated HCA, writable
    by the sglang-stub (it runs as the service user) which adds the KV bytes it moves over the device
    (roles/acceptance reads them before/after a run). Not part of the rendered fixtures."""
    ib = os.path.join(tree, "class", "infiniband")
    for dev in sorted(os.listdir(ib)) if os.path.isdir(ib) else []:
        ports = os.path.join(ib, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            cdir = os.path.join(ports, port, "counters")
            os.makedirs(cdir, exist_ok=True)
            os.chmod(cdir, 0o777)
            for name in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"):
                with open(os.path.join(cdir, name), "w") as fh:
                    fh.write("0\n")
                os.chmod(os.path.join(cdir, name), 0o666)


# IB port error counters (ports/<p>/counters/) and RDMA transport counters (ports/<p>/hw_counters/): the names the
# on-call reference lists (../shared/reference/oncall-triage-anchors.md R4, R5; gpud class/types.go). Used by the
# health_history sampler's sandbox test, which bumps one to see the delta charged to that NIC.
IB_ERROR_COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors",
                     "port_rcv_remote_physical_errors", "local_link_integrity_errors", "excessive_buffer_overrun_errors",
                     "port_xmit_discards", "port_rcv_switch_relay_errors", "VL15_dropped", "port_xmit_wait")
RDMA_HW_COUNTERS = ("local_ack_timeout_err", "packet_seq_err", "out_of_sequence", "implied_nak_seq_err",
                    "rnr_nak_retry_err", "req_cqe_error", "req_cqe_flush_error", "resp_cqe_error",
                    "req_remote_access_errors", "resp_remote_access_errors", "out_of_buffer", "duplicate_request")


def add_error_counters(tree):
    """Every counter above = 0 on every emulated HCA port, unless the tree already has that file (a scenario's value
    wins). Mode 0644: root (a test) may change them, the sampler's unprivileged user reads them. Not part of the
    rendered fixtures."""
    ib = os.path.join(tree, "class", "infiniband")
    for dev in sorted(os.listdir(ib)) if os.path.isdir(ib) else []:
        ports = os.path.join(ib, dev, "ports")
        for port in sorted(os.listdir(ports)) if os.path.isdir(ports) else []:
            for sub, names in (("counters", IB_ERROR_COUNTERS), ("hw_counters", RDMA_HW_COUNTERS)):
                cdir = os.path.join(ports, port, sub)
                os.makedirs(cdir, exist_ok=True)
                for name in names:
                    path = os.path.join(cdir, name)
                    if not os.path.exists(path):
                        with open(path, "w") as fh:
                            fh.write("0\n")
                        os.chmod(path, 0o644)


def set_scenario(name, root=None):
    root = root or root_dir()
    if name not in scenarios.ALL:
        die("hwemu-scenario: unknown scenario %r; known: %s" % (name, " ".join(scenarios.ALL)), 2)
    trees = os.path.join(root, "trees")
    tree = os.path.join(trees, name)
    tmp = tree + ".tmp"
    if os.path.isdir(tmp):
        import shutil
        shutil.rmtree(tmp)
    if name in scenarios.REAL_SCENARIOS:
        os.makedirs(os.path.join(tmp, "devices", "system", "node", "node0"))
        with open(os.path.join(tmp, "devices", "system", "node", "node0", "cpulist"), "w") as fh:
            fh.write("0-15\n")
        with open(os.path.join(tmp, "REAL_REPLAY"), "w") as fh:
            fh.write("h200_real: tool outputs replay real/nvidia-h200-vm; this host has no RDMA NICs\n")
    else:
        st = model.build_state(name, os.environ.get("HWEMU_HOSTNAME") or hostname())
        model.build_sys_tree(st, tmp)
        model.add_triage_tree(st, tmp)
        add_traffic_counters(tmp)
        add_error_counters(tmp)
        proc = os.path.join(root, "proc")
        os.makedirs(proc, exist_ok=True)
        for fn, text in model.proc_files(st).items():
            with open(os.path.join(proc, fn), "w") as fh:
                fh.write(text)
    import shutil
    if os.path.isdir(tree):
        shutil.rmtree(tree)
    os.rename(tmp, tree)
    link = os.path.join(root, "sys")
    tmpl = link + ".new"
    if os.path.lexists(tmpl):
        os.remove(tmpl)
    os.symlink(os.path.join("trees", name), tmpl)
    os.replace(tmpl, link)
    sd = os.path.join(root, "state")
    os.makedirs(sd, exist_ok=True)
    for f in os.listdir(sd):
        if f in ("nccl_calls", "load.json", "fw.json", "mlxfwreset.json", "burn_fail") or f.startswith(("nccl_calls_", "ibwb-")):
            try:
                os.remove(os.path.join(sd, f))
            except OSError:
                pass
    with open(os.path.join(root, "scenario.tmp"), "w") as fh:
        fh.write(name + "\n")
    os.replace(os.path.join(root, "scenario.tmp"), os.path.join(root, "scenario"))


def hwemu_scenario(argv):
    if not argv or argv[0] in ("-h", "--help"):
        out("usage: hwemu-scenario NAME | --list | --show\ncurrent: %s\nscenarios: %s\n" % (
            current_scenario(), " ".join(scenarios.ALL)))
        return None
    if argv[0] == "--list":
        return out("".join(n + "\n" for n in scenarios.ALL))
    if argv[0] == "--show":
        return out(current_scenario() + "\n")
    set_scenario(argv[0])
    out("hwemu: scenario %s (%s)\n" % (
        argv[0], "replaying REAL 1xH200 captures" if argv[0] in scenarios.REAL_SCENARIOS else "SYNTHESIZED hardware"))
    return None


# `ethtool -S <netdev>` of an mlx5 netdev. Format: ethtool.c do_gstats prints "NIC statistics:" and then one
# "     %.*s: %llu" line per counter (five spaces, name, colon, value; ethtool.c do_gstats, code index file id
# 1373379714), as the real captures in
# tests/fixtures/real-world/ethtool_stats/ show; names and meanings: NVIDIA "Understanding mlx5 ethtool Counters"
# (docs/triage-real-world.md). An mlx5 IPoIB netdev prints the PHY group too (en/ipoib/ipoib.c mlx5i_stats_grps).
ETHTOOL_SW = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "rx_csum_complete", "tx_queue_dropped",
              "rx_out_of_buffer", "rx_if_down_packets")
ETHTOOL_PHY = ("rx_packets_phy", "rx_bytes_phy", "tx_packets_phy", "tx_bytes_phy", "rx_crc_errors_phy",
               "rx_in_range_len_errors_phy", "rx_out_of_range_len_phy", "rx_oversize_pkts_phy", "rx_symbol_err_phy",
               "rx_discards_phy", "tx_discards_phy", "tx_errors_phy", "rx_undersize_pkts_phy", "rx_fragments_phy",
               "rx_jabbers_phy", "link_down_events_phy", "rx_pcs_symbol_err_phy", "rx_corrected_bits_phy",
               "rx_err_lane_0_phy", "rx_err_lane_1_phy", "rx_err_lane_2_phy", "rx_err_lane_3_phy",
               "rx_pci_signal_integrity", "tx_pci_signal_integrity", "outbound_pci_stalled_rd",
               "outbound_pci_stalled_wr", "module_unplug", "module_bus_stuck", "module_high_temp",
               "module_bad_shorted")


def ethtool(argv):
    """`ethtool -S NETDEV` (read only): the mlx5 software and PHY counters of a NIC's netdev. Healthy: no error, a
    few FEC-corrected bits on the data NICs (a PAM4 link corrects some); a scenario's st["triage"]["phy"][nic] and
    the test hook state/ethtool.json ({netdev: {counter: value}}) add to them. Other ethtool options are refused."""
    st = load_state()
    if len(argv) != 2 or argv[0] not in ("-S", "--statistics"):
        die("ethtool (hwemu stand-in): only `ethtool -S NETDEV` is emulated", 1)
    nic = next((n for n in (st or {}).get("nics") or [] if n["netdev"] == argv[1]), None)
    if nic is None:
        die("Cannot get stats strings information: No such device", 96)   # ethtool.c do_gstats: perror, 96
    vals = {c: 0 for c in ETHTOOL_SW + ETHTOOL_PHY}
    vals.update({"rx_packets": 48213, "tx_packets": 47991, "rx_bytes": 9104520, "tx_bytes": 8962214,
                 "rx_packets_phy": 48213, "tx_packets_phy": 47991, "rx_bytes_phy": 9297372, "tx_bytes_phy": 9154178,
                 "rx_corrected_bits_phy": 112 if nic["role"] == "data" else 0})
    for c, v in (st["triage"].get("phy", {}).get(nic["name"]) or {}).items():
        vals[c] = vals.get(c, 0) + int(v)
    try:
        with open(os.path.join(state_dir(), "ethtool.json")) as fh:
            for c, v in (json.load(fh).get(nic["netdev"]) or {}).items():
                vals[c] = vals.get(c, 0) + int(v)
    except (OSError, ValueError):
        pass
    return out("NIC statistics:\n" + "".join("     %s: %d\n" % (c, vals[c]) for c in vals))


def modinfo_installed(mods, field, kernel):
    """`modinfo [-k KERNEL] [-F FIELD] MODULE...` from the installed packages (hoststack.kernel_modules): kmod's
    `modinfo: ERROR: Module X not found.` (rc 1) for a module no package of that kernel provides."""
    have = hoststack.kernel_modules(hoststack.installed_packages(), kernel)
    rc = 0
    for m in mods:
        info = have.get(m)
        if info is None:
            sys.stderr.write("modinfo: ERROR: Module %s not found.\n" % m)
            rc = 1
            continue
        f = {"filename": info["filename"], "version": info.get("version", ""), "name": m,
             "vermagic": "%s SMP preempt mod_unload modversions " % kernel, "signer": info["signer"],
             "sig_key": "" if not info["signer"] else "hwemu", "sig_hashalgo": "" if not info["signer"] else "sha512"}
        if field:
            if f.get(field):
                out(f[field] + "\n")
        else:
            out("".join("%-15s %s\n" % (k + ":", v) for k, v in f.items() if v))
    sys.exit(rc)


def modprobe_tool(argv):
    """`modprobe NAME...` (hoststack.record_modprobe): loads what an installed package of the running kernel provides
    (kept for this boot in the run dir), else kmod's `modprobe: FATAL: Module X not found in directory ...` rc 1."""
    names = [a for a in argv if not a.startswith("-")]
    if not names:
        die("modprobe: ERROR: missing parameters. See -h.", 1)
    rc, err = hoststack.record_modprobe(run_dir(), root_dir(), names)
    if rc:
        die(err, rc)


def mokutil(argv):
    """`mokutil --sb-state`: mokutil's `SecureBoot enabled|disabled` from <root>/state/secure_boot (default disabled)."""
    if argv[:1] != ["--sb-state"]:
        die("mokutil (hwemu stand-in): only --sb-state is emulated", 1)
    try:
        with open(os.path.join(state_dir(), "secure_boot")) as fh:
            on = fh.read().strip() == "enabled"
    except OSError:
        on = False
    out("SecureBoot %s\n" % ("enabled" if on else "disabled"))


def _keep_running(argv):
    """The daemon part: `--no-wait` returns (tests); `--fork` leaves a `sleep infinity` child and exits 0, as a
    Type=forking unit's start does (the real nvidia-fabricmanager.service is Type=forking: systemd then logs
    "Starting ..." before the start's lines, which the proof uses to judge the last start); else sleep here."""
    if "--no-wait" in argv:
        return None
    if "--fork" in argv:
        sys.stdout.flush()
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", ["sleep", "infinity"])
        os._exit(0)
    os.execv("/bin/sleep", ["sleep", "infinity"])


def fabricmanager(argv):
    """The emulated nvidia-fabricmanager unit's ExecStart. A host whose stack dpkg never saw: keeps running, as the
    unit always did. Otherwise the start judged from the installed stack (hoststack.fabric_manager_start): its lines
    go to stdout (the unit's journal), a failure exits 1 (systemd then logs the unit failed), success keeps running."""
    res = hoststack.record_fm_start(run_dir(), root_dir(), bridge=True)
    if res is not None:
        ok, lines = res
        out("".join(ln + "\n" for ln in lines))
        if not ok:
            sys.exit(1)
    return _keep_running(argv)


TOOLS = {
    "nvidia-smi": nvidia_smi, "ibstat": ibstat, "ibv_devinfo": ibv_devinfo, "mlxfwmanager": mlxfwmanager,
    "mlxup": lambda a: mlxfwmanager(a, "mlxup"), "ofed_info": ofed_info, "modinfo": modinfo, "flint": flint,
    "mstflint": lambda a: flint(a, "mstflint"), "mlxfwreset": mlxfwreset, "all_reduce_perf": run_all_reduce, "mpirun": mpirun,
    "gpu_burn": gpu_burn, "gpu-burn": gpu_burn, "hwemu-scenario": hwemu_scenario,
    "nvidia-modprobe": nvidia_modprobe, "journalctl": journalctl, "dmesg": dmesg, "devlink": devlink,
    "lspci": lspci, "setpci": setpci, "lsmod": lsmod, "ib_write_bw": ib_write_bw, "ethtool": ethtool,
    "modprobe": modprobe_tool, "mokutil": mokutil, "nv-fabricmanager-emu": fabricmanager,
}


def main(tool, argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        TOOLS[tool](argv)
    except BrokenPipeError:
        pass
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        die("usage: hwemu_cli.py TOOL [ARGS...]  (" + " ".join(sorted(TOOLS)) + ")")
    main(sys.argv[1], sys.argv[2:])
