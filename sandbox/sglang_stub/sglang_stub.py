#!/usr/bin/env python3
"""SGLang TEST DOUBLE: `sglang serve ARGV` / `sglang version` for the b300-rollout sandbox.

THIS IS NOT SGLANG. It parses the server command line with argparse built from the option catalog dumped from the
real `sglang serve` parser of the same version (options/server-options-<ver>.json, see
tools/sglang_argcheck/dump_options.py), so unknown flags, bad choices, bad types and prefix abbreviations behave as
they do in the real parser (exit 2 with an argparse message). Then it serves the SGLang HTTP API that the real
sglang-router 0.3.2 and our roles use, with deterministic answers that name the instance.

Python 3.11 standard library only (the sandbox hosts have no pip packages).

Environment knobs (all optional):
  SGLANG_STUB_VERSION         version when the executable name carries none (sglang-0.5.17 -> 0.5.17)
  SGLANG_STUB_LOAD_SECONDS    simulated model load; /health answers 503 meanwhile (default 2)
  SGLANG_STUB_LATENCY_MS      time each inference request takes (default 0)
  SGLANG_STUB_FAULT           space/comma separated faults: unhealthy, error500, hang, die_after_load,
                                unhealthy_after_restart (= unhealthy for a process started after the control file
                                was written; the process already running stays healthy: a restart that never comes up),
                                refuse_api_key (exit 1 at start when started with --api-key: a key this server refuses),
                                refuse_flag:--NAME (exit 1 at start when argv holds --NAME: a flag it refuses at start)
  SGLANG_STUB_CONTROL_DIR     control directory (default /run/sglang-stub/<port>); files read on every request:
                                fault       same words as SGLANG_STUB_FAULT (replaces the env value while present)
                                latency_ms  replaces SGLANG_STUB_LATENCY_MS while present
  SGLANG_STUB_DRAIN_SECONDS   longest wait for in-flight requests after SIGTERM (default 30)
  SGLANG_STUB_HANG_MAX_SECONDS  a hung request gives up (504) after this long (default 600)
  SGLANG_STUB_INSTANCE_NAME   name in the answer text (default <hostname>:<port> when --host is a wildcard)
  SGLANG_STUB_CHECK_ONLY=1    `serve ARGV` only parses (exit 0 accepted / 2 refused) and starts nothing
"""

import argparse
import collections
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HERE = os.path.dirname(os.path.abspath(__file__))
# In the repository the stub uses the role's option catalogs and the collection's argparse_abbrev.py (one copy of
# each); sandbox/fleet.sh ships both next to the stub on the hosts (/opt/sglang-stub/options, argparse_abbrev.py).
_REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
_REPO_OPTIONS = os.path.join(_REPO, "roles", "sglang", "files", "options")
OPTIONS_DIR = os.environ.get("SGLANG_STUB_OPTIONS_DIR") or (
    os.path.join(HERE, "options") if os.path.isdir(os.path.join(HERE, "options")) else _REPO_OPTIONS)
try:
    import argparse_abbrev  # shipped next to the stub by fleet.sh
except ImportError:
    sys.path.insert(0, os.path.join(_REPO, "collections"))
    from ansible_collections.b300.rollout.plugins.module_utils import argparse_abbrev
PROG = "sglang serve"
KNOWN_FAULTS = ("unhealthy", "error500", "hang", "die_after_load", "unhealthy_after_restart", "refuse_api_key")


# ---------------------------------------------------------------------------------------------------------------
# Versions and the option catalog
# ---------------------------------------------------------------------------------------------------------------

def version_from_name(argv0, env=None):
    """sglang-0.5.17 -> '0.5.17'; plain 'sglang' -> $SGLANG_STUB_VERSION or None."""
    env = os.environ if env is None else env
    m = re.search(r"sglang-(\d+(?:\.\d+)+(?:\.post\d+|rc\d+)?)$", os.path.basename(argv0))
    if m:
        return m.group(1)
    return env.get("SGLANG_STUB_VERSION") or None


def available_versions(options_dir=OPTIONS_DIR):
    out = []
    for name in sorted(os.listdir(options_dir)):
        m = re.match(r"server-options-(.+)\.json$", name)
        if m:
            out.append(m.group(1))
    return out


def load_catalog(version, options_dir=OPTIONS_DIR):
    path = os.path.join(options_dir, "server-options-%s.json" % version)
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


# Type callables, named and behaving like the real ones (sglang.srt.utils.common, cuda_graph_config) so that
# argparse's accept/refuse verdict and its "invalid <name> value" / ArgumentTypeError messages match.
def human_readable_int(value):
    """'1k' -> 1000, '25.6k' -> 25600, '1Ki' -> 1024, '262144' -> 262144 (suffixes case-sensitive)."""
    value = value.strip()
    si = {"k": 10 ** 3, "M": 10 ** 6, "G": 10 ** 9, "T": 10 ** 12}
    iec = {"Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    "Decimals are not allowed with IEC suffixes like '%s'. Use an integer IEC value such as "
                    "'%d%s', or an SI value such as '%s%s'." % (suffix, int(Decimal(number)), suffix, number,
                                                                   suffix[0]))
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            "Invalid integer value: '%s'. Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive." % value) from None


def loads(value):
    return json.loads(value)


def json_list_type(value):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            "Invalid JSON list: %s. Please provide a valid JSON list." % value) from None


def nullable_str(value):
    if not value or value == "None":
        return None
    return value


CUDA_GRAPH_PHASES = ("decode", "prefill")


def parse_cuda_graph_config_arg(raw):
    """JSON object keyed by phase; the real one also checks the keys of each phase (not in the catalog)."""
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError("--cuda-graph-config must be JSON: %s" % exc) from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            "--cuda-graph-config must be a JSON object, got %s" % type(parsed).__name__)
    for phase, settings in parsed.items():
        if str(phase) not in CUDA_GRAPH_PHASES:
            raise argparse.ArgumentTypeError("--cuda-graph-config: unknown phase '%s', expected one of %s"
                                             % (phase, CUDA_GRAPH_PHASES))
        if not isinstance(settings, dict):
            raise argparse.ArgumentTypeError("--cuda-graph-config['%s'] must be a JSON object, got %s"
                                             % (phase, type(settings).__name__))
    return parsed


TYPE_FUNCS = {
    None: None,
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "json_list_type": json_list_type,
    "human_readable_int": human_readable_int,
    "nullable_str": nullable_str,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
}

REQUIRED_DESTS = ("model_path",)
_NARGS0_ACTIONS = ("_StoreTrueAction", "DeprecatedStoreTrueAction", "DeprecatedAction", "DeprecatedStoreConstAction",
                   "_StoreConstAction", "_StoreFalseAction")


def build_parser(catalog, prog=PROG):
    """An argparse parser equivalent (for accept/refuse) to the real one the catalog was dumped from."""
    parser = argparse.ArgumentParser(prog=prog, allow_abbrev=True)
    # The catalog has no "required" field: the real parser requires --model-path (alias --model), one action with
    # both option strings ("the following arguments are required: --model-path/--model").
    required = [o for o in sorted(catalog) if catalog[o].get("dest") in REQUIRED_DESTS]
    required.sort(key=lambda o: o != "--" + catalog[o]["dest"].replace("_", "-"))
    if required:
        spec = catalog[required[0]]
        parser.add_argument(*required, dest=spec["dest"], type=TYPE_FUNCS.get(spec.get("type"), str), required=True)
    for opt in sorted(catalog):
        spec = catalog[opt]
        action = spec.get("action")
        if action == "_HelpAction" or opt in ("-h", "--help") or opt in required:
            continue
        dest = spec.get("dest")
        if action == "BooleanOptionalAction":
            if opt.startswith("--no-") and ("--" + opt[5:]) in catalog:
                continue  # created together with its positive form
            parser.add_argument(opt, dest=dest, action=argparse.BooleanOptionalAction)
            continue
        nargs = spec.get("nargs")
        if action in _NARGS0_ACTIONS or nargs == 0:
            kw = {"dest": dest, "action": "store_true"}
            if action and action.startswith("Deprecated"):
                kw["help"] = "deprecated"
            parser.add_argument(opt, **kw)
            continue
        tname = spec.get("type")
        if tname not in TYPE_FUNCS:
            tfunc = str  # unknown custom type: accept any text (the real one may be stricter)
        else:
            tfunc = TYPE_FUNCS[tname]
        kw = {"dest": dest, "type": tfunc}
        if nargs is not None:
            kw["nargs"] = nargs
        if spec.get("choices") is not None:
            kw["choices"] = spec["choices"]
        if action and action.startswith("Deprecated"):
            kw["help"] = "deprecated"
        parser.add_argument(opt, **kw)
    return parser


def abbreviations(parser, argv):
    """[(used, long_form)] for each unique-prefix option in argv (argparse allow_abbrev accepts them)."""
    opts = parser._option_string_actions  # pylint: disable=protected-access
    return [(a["used"], a["long"]) for a in argparse_abbrev.abbreviations(argv, opts)]


def deprecated_used(catalog, argv):
    out = []
    for tok in argv:
        name = tok.split("=", 1)[0]
        spec = catalog.get(name)
        if spec and str(spec.get("action", "")).startswith("Deprecated"):
            out.append(name)
    return out


def serve_preprocess(argv, stderr):
    """What the real `sglang serve` does before its parser: strip --model-type, positional model path."""
    out, i, model_type = [], 0, "auto"
    argv = list(argv)
    while i < len(argv):
        if argv[i] == "--model-type":
            if i + 1 >= len(argv):
                stderr.write("Error: --model-type requires a value. Valid values are: auto, llm, diffusion.\n")
                raise SystemExit(1)
            model_type, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--model-type="):
            model_type, i = argv[i].split("=", 1)[1], i + 1
            continue
        out.append(argv[i])
        i += 1
    if model_type not in ("auto", "llm", "diffusion"):
        # 0.5.17 raises "Error: invalid --model-type ..."; 0.5.18 "Unknown serve backend ..." (both exit non-zero)
        stderr.write("Error: invalid --model-type '%s'. Valid values are: auto, llm, diffusion.\n" % model_type)
        raise SystemExit(1)
    if model_type == "diffusion":
        stderr.write("sglang-stub: --model-type diffusion is not emulated (LLM server only)\n")
        raise SystemExit(1)
    if out and not out[0].startswith("-"):
        out = ["--model-path", out[0]] + out[1:]
    return out


def parse_serve_args(version, argv, options_dir=OPTIONS_DIR, stderr=None):
    """Parse like the real `sglang serve`. Returns (namespace, warnings). Raises SystemExit(2) on refusal."""
    stderr = sys.stderr if stderr is None else stderr
    catalog = load_catalog(version, options_dir)
    parser = build_parser(catalog)
    argv = serve_preprocess(argv, stderr)
    ns = parser.parse_args(argv)
    warnings = ["option %s is an abbreviation of %s (accepted by argparse prefix matching; render the long name)"
                % (short, long_) for short, long_ in abbreviations(parser, argv)]
    warnings += ["option %s is deprecated in sglang %s" % (name, version) for name in deprecated_used(catalog, argv)]
    return ns, warnings


def check_argv(version, argv, options_dir=OPTIONS_DIR):
    """(exit_code, message) without raising: 0 accepted, 2 refused (message = argparse's error text)."""
    import contextlib
    import io
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parse_serve_args(version, argv, options_dir, stderr=err)
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        errs = [ln for ln in lines if ": error: " in ln or ln.startswith("Error:")]
        return (exc.code if isinstance(exc.code, int) else 2), (errs[-1] if errs else (lines[-1] if lines else ""))
    return 0, ""


# ---------------------------------------------------------------------------------------------------------------
# Runtime state
# ---------------------------------------------------------------------------------------------------------------

def log(level, msg):
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    sys.stderr.write("[%s] %s %s\n" % (ts, level, msg))
    sys.stderr.flush()


class StubState:
    def __init__(self, ns, version, env=None):
        env = os.environ if env is None else env
        self.env = env
        self.version = version
        self.ns = ns
        self.host = getattr(ns, "host", None) or "127.0.0.1"
        self.port = int(getattr(ns, "port", None) or 30000)
        self.model_path = getattr(ns, "model_path", None) or "stub-model"
        self.served_model_name = getattr(ns, "served_model_name", None) or self.model_path
        self.tp_size = int(getattr(ns, "tp_size", None) or 1)
        self.dp_size = int(getattr(ns, "dp_size", None) or 1)
        self.mode = getattr(ns, "disaggregation_mode", None) or "null"
        self.bootstrap_port = int(getattr(ns, "disaggregation_bootstrap_port", None) or 8998)
        self.api_key = getattr(ns, "api_key", None)
        self.enable_metrics = bool(getattr(ns, "enable_metrics", False))
        self.context_length = getattr(ns, "context_length", None) or 32768
        if env.get("SGLANG_STUB_INSTANCE_NAME"):
            self.instance = env["SGLANG_STUB_INSTANCE_NAME"]
        elif self.host in ("0.0.0.0", "::", ""):
            self.instance = "%s:%d" % (socket.gethostname(), self.port)
        else:
            self.instance = "%s:%d" % (self.host, self.port)
        self.load_seconds = float(env.get("SGLANG_STUB_LOAD_SECONDS", "2"))
        self.drain_seconds = float(env.get("SGLANG_STUB_DRAIN_SECONDS", "30"))
        self.hang_max_seconds = float(env.get("SGLANG_STUB_HANG_MAX_SECONDS", "600"))
        self.control_dir = env.get("SGLANG_STUB_CONTROL_DIR") or "/run/sglang-stub/%d" % self.port
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.lock = threading.Lock()
        self.inflight = 0
        self.inflight_tokens = 0
        self.draining = False
        self.counters = collections.Counter()
        self.requests = collections.deque(maxlen=100)
        self.last_bootstrap = None
        self.seen_prompts = set()
        self.latencies = []
        # acceptance (roles/acceptance): an honest prefix cache, PD KV hand-off and emulated NIC counters
        self.prefix_cache = PrefixCache(int(getattr(ns, "page_size", None) or 1),
                                        int(env.get("SGLANG_STUB_CACHE_TOKENS") or
                                            getattr(ns, "max_total_tokens", None) or 1000000))
        self.engine_type = {"prefill": "prefill", "decode": "decode"}.get(self.mode, "unified")
        self.ib_devices = [d.strip() for d in re.split(r"[,\s]+", str(getattr(ns, "disaggregation_ib_device", None)
                                                                       or "")) if d.strip() and ":" not in d]
        self.sysfs_root = env.get("SGLANG_STUB_SYSFS_ROOT", "/opt/hwemu/sys")
        self.kv_bytes_per_token = int(env.get("SGLANG_STUB_KV_BYTES_PER_TOKEN", "4096"))
        self.kv_rooms = {}

    def active_devices(self):
        return active_hcas(self.sysfs_root, self.ib_devices)

    def transport(self):
        """Mooncake's choice: TCP when MC_FORCE_TCP is set (or the control file `mooncake_transport` says tcp, the
        sandbox's way to emulate a lost HCA) or when no listed device has an ACTIVE port; RDMA otherwise."""
        forced = (self._control("mooncake_transport") or "").strip()
        if forced in ("tcp", "rdma"):
            return forced
        if self.env.get("MC_FORCE_TCP"):
            return "tcp"
        return "rdma" if self.active_devices() else "tcp"

    # -- knobs ---------------------------------------------------------------------------------------------------
    def _control(self, name):
        try:
            with open(os.path.join(self.control_dir, name), encoding="utf-8") as fh:
                return fh.read().strip()
        except OSError:
            return None

    def faults(self):
        raw = self._control("fault")
        if raw is None:
            raw = self.env.get("SGLANG_STUB_FAULT", "")
        words = {w for w in re.split(r"[\s,]+", raw) if w}
        if "unhealthy_after_restart" in words:
            try:
                armed = os.path.getmtime(os.path.join(self.control_dir, "fault"))
            except OSError:
                armed = 0.0
            if armed < self.started_wall:
                words.add("unhealthy")
        return words

    def latency_s(self):
        raw = self._control("latency_ms")
        if raw is None:
            raw = self.env.get("SGLANG_STUB_LATENCY_MS", "0")
        try:
            return max(0.0, float(raw)) / 1000.0
        except ValueError:
            return 0.0

    def loaded(self):
        return time.monotonic() - self.started >= self.load_seconds

    def healthy(self):
        return self.loaded() and "unhealthy" not in self.faults() and not self.draining

    def answer_text(self):
        return "stub %s on %s (sglang %s, %s)" % (self.served_model_name, self.instance, self.version, self.mode)

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)
            if entry.get("bootstrap_room") is not None or entry.get("bootstrap_host") is not None:
                self.last_bootstrap = {k: entry.get(k) for k in ("bootstrap_room", "bootstrap_host", "bootstrap_port")}

    def server_info(self):
        return {
            "served_model_name": self.served_model_name,
            "tp_size": self.tp_size,
            "dp_size": self.dp_size,
            "disaggregation_mode": self.mode,
            "disaggregation_bootstrap_port": self.bootstrap_port if self.mode == "prefill" else None,
            "context_length": self.context_length,
            "version": self.version,
            "host": self.host,
            "port": self.port,
            "status": "ready" if self.loaded() else "loading",
            "test_double": True,
            "internal_states": [{"last_gen_throughput": 42.0, "avg_spec_accept_length": None}],
        }

    def model_info(self):
        # No model_path / tokenizer_path: the real router would try to download a tokenizer for them.
        return {"is_generation": True, "model_type": "stub", "architectures": ["StubForCausalLM"],
                "served_model_name": self.served_model_name, "test_double": True}


class PrefixCache:
    """Radix-like prefix cache of token blocks (page_size tokens each, chained hashes), a token capacity and LRU
    eviction. match() returns the cached prefix length in tokens; insert() adds the prompt's full blocks."""

    def __init__(self, block, capacity):
        self.block = max(1, block)
        self.capacity = max(self.block, capacity)
        self.blocks = collections.OrderedDict()
        self.evicted = 0

    def _keys(self, tokens):
        keys, h = [], 0
        for i in range(0, len(tokens) - len(tokens) % self.block, self.block):
            h = hash((h, tuple(tokens[i:i + self.block])))
            keys.append(h)
        return keys

    def match(self, tokens):
        n = 0
        for k in self._keys(tokens):
            if k not in self.blocks:
                break
            self.blocks.move_to_end(k)
            n += 1
        return min(n * self.block, max(0, len(tokens) - 1))

    def insert(self, tokens):
        for k in self._keys(tokens):
            self.blocks[k] = True
            self.blocks.move_to_end(k)
        while len(self.blocks) * self.block > self.capacity:
            self.blocks.popitem(last=False)
            self.evicted += self.block

    def clear(self):
        self.blocks.clear()


def bump_nic_counters(sysfs_root, devices, name, nbytes):
    """Emulated NIC: add nbytes (spread over devices) to ports/1/counters/<name>, in 4-byte units like mlx5."""
    if not devices or nbytes <= 0 or os.path.realpath(sysfs_root) == "/sys":
        return
    import fcntl  # pylint: disable=import-outside-toplevel
    share = nbytes // len(devices)
    for dev in devices:
        path = os.path.join(sysfs_root, "class", "infiniband", dev, "ports", "1", "counters", name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "a+", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.seek(0)
                old = int((fh.read().strip() or "0"))
                fh.seek(0)
                fh.truncate()
                fh.write("%d\n" % (old + share // 4))
        except (OSError, ValueError) as exc:
            log("WARNING", "emulated NIC counter %s not writable: %s" % (path, exc))


def active_hcas(sysfs_root, devices):
    """Mooncake-like discovery: the listed devices whose port 1 is ACTIVE in the (emulated) sysfs."""
    out = []
    for dev in devices:
        try:
            with open(os.path.join(sysfs_root, "class", "infiniband", dev, "ports", "1", "state"),
                      encoding="utf-8") as fh:
                if "ACTIVE" in fh.read():
                    out.append(dev)
        except OSError:
            continue
    return out


def count_tokens(text):
    return max(1, len(str(text).split()))


def prompt_of(path, body):
    if path.endswith("/chat/completions"):
        parts = []
        for msg in body.get("messages") or []:
            content = msg.get("content") if isinstance(msg, dict) else msg
            if isinstance(content, list):
                parts += [c.get("text", "") for c in content if isinstance(c, dict)]
            elif content is not None:
                parts.append(str(content))
        return "\n".join(parts)
    if path.endswith("/completions"):
        p = body.get("prompt", "")
        return " ".join(map(str, p)) if isinstance(p, list) else str(p)
    text = body.get("text")
    if text is None and body.get("input_ids") is not None:
        return " ".join(map(str, body["input_ids"]))
    return " ".join(map(str, text)) if isinstance(text, list) else str(text or "")


# ---------------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------------

INFERENCE_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-stub"
    state = None  # set per server class

    # quieter, uvicorn-like access log
    def log_message(self, fmt, *args):  # noqa: N802 (stdlib name)
        log("INFO", "%s:%s - %s" % (self.client_address[0], self.client_address[1], fmt % args))

    # -- helpers -------------------------------------------------------------------------------------------------
    def _send(self, code, body=b"", ctype="application/json", headers=None):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        self.send_response(code)
        if body or code != 200 or ctype != "application/json":
            self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        if self.state.draining:
            self.send_header("Connection", "close")
            self.close_connection = True
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _read_body(self):
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            data = b""
            while True:
                line = self.rfile.readline().strip()
                size = int(line.split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data += self.rfile.read(size)
                self.rfile.readline()
            return data
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _authorized(self, path):
        key = self.state.api_key
        if not key or path.startswith("/health") or path.startswith("/metrics") or path.startswith("/stub/"):
            return True
        return self.headers.get("Authorization", "") == "Bearer %s" % key

    def _chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    # -- dispatch ------------------------------------------------------------------------------------------------
    def do_HEAD(self):  # noqa: N802
        self.do_GET()

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    def _dispatch(self, method):
        st = self.state
        path = self.path.split("?", 1)[0]
        raw = self._read_body() if method in ("POST", "PUT") else b""
        with st.lock:
            st.inflight += 1
            st.counters["http_requests"] += 1
        try:
            if st.draining and not path.startswith("/stub/"):
                self._send(503, {"error": "server is shutting down (stub draining)"})
                return
            if not self._authorized(path):
                self._send(401, {"error": "Unauthorized"})
                return
            self._route(method, path, raw)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with st.lock:
                st.inflight -= 1

    def _route(self, method, path, raw):
        st = self.state
        if path == "/health":
            return self._send(200 if st.healthy() else 503, b"")
        if path == "/health_generate":
            ok = st.healthy() and "error500" not in st.faults() and "hang" not in st.faults()
            return self._send(200 if ok else 503, b"")
        if path in ("/server_info", "/get_server_info"):
            return self._send(200, st.server_info())
        if path in ("/model_info", "/get_model_info"):
            return self._send(200, st.model_info())
        if path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{
                "id": st.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": st.served_model_name, "max_model_len": st.context_length}]})
        if path == "/get_load":
            with st.lock:
                reqs, toks = max(0, st.inflight - 1), st.inflight_tokens
            return self._send(200, [{"dp_rank": r, "num_reqs": reqs if r == 0 else 0, "num_waiting_reqs": 0,
                                     "num_tokens": toks if r == 0 else 0} for r in range(st.dp_size)])
        if path == "/metrics":
            if not st.enable_metrics:
                return self._send(404, {"detail": "Not Found"})
            return self._send(200, self._metrics(), ctype="text/plain; version=0.0.4; charset=utf-8")
        if path == "/flush_cache":
            with st.lock:
                st.seen_prompts.clear()
                st.prefix_cache.clear()
            return self._send(200, "Cache flushed.\nPlease check backend logs for more details. "
                                   "(When there are running or waiting requests, the operation will not be performed.)\n",
                              ctype="text/plain")
        if path == "/stub/last_requests":
            with st.lock:
                return self._send(200, {"instance": st.instance, "mode": st.mode, "version": st.version,
                                        "last_bootstrap": st.last_bootstrap, "requests": list(st.requests)})
        if path == "/stub/state":
            with st.lock:
                data = {"instance": st.instance, "mode": st.mode, "version": st.version, "loaded": st.loaded(),
                        "healthy": st.healthy(), "draining": st.draining, "inflight": st.inflight - 1,
                        "counters": dict(st.counters)}
            data.update({"faults": sorted(st.faults()), "latency_ms": st.latency_s() * 1000.0, "pid": os.getpid()})
            return self._send(200, data)
        if path == "/stub/reset" and method == "POST":
            with st.lock:
                st.requests.clear()
                st.last_bootstrap = None
                st.counters.clear()
            return self._send(200, {"status": "reset"})
        if path in INFERENCE_PATHS:
            if method != "POST":
                return self._send(405, {"detail": "Method Not Allowed"})
            return self._inference(path, raw)
        return self._send(404, {"detail": "Not Found"})

    # -- inference -----------------------------------------------------------------------------------------------
    def _inference(self, path, raw):
        st = self.state
        t0 = time.monotonic()
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as exc:
            return self._send(400, {"error": {"message": "invalid JSON body: %s" % exc, "type": "BadRequest"}})
        rid = body.get("rid") or uuid.uuid4().hex
        entry = {"time": time.time(), "path": path, "rid": rid, "stream": bool(body.get("stream")),
                 "model": body.get("model"), "bootstrap_room": body.get("bootstrap_room"),
                 "bootstrap_host": body.get("bootstrap_host"), "bootstrap_port": body.get("bootstrap_port"),
                 "x_request_id": self.headers.get("X-Request-Id"), "mode": st.mode}
        if not st.loaded():
            entry["status"] = 503
            st.record(entry)
            return self._send(503, {"error": {"message": "model is still loading (stub)", "type": "ServiceUnavailable"}})
        faults = st.faults()
        if "hang" in faults:
            deadline = t0 + st.hang_max_seconds
            while "hang" in st.faults() and time.monotonic() < deadline:
                time.sleep(0.2)
            if "hang" in st.faults():
                entry["status"] = 504
                st.record(entry)
                return self._send(504, {"error": "stub hang gave up"})
            faults = st.faults()
        if "error500" in faults:
            entry["status"] = 500
            st.record(entry)
            with st.lock:
                st.counters["generation_errors"] += 1
            return self._send(500, {"error": "stub forced 500"})

        prompt = prompt_of(path, body)
        p_tokens = count_tokens(prompt)
        toks = str(prompt).split() or [""]
        with st.lock:
            # decode has no radix cache (SGLang PD): its cached_tokens is the prefill's, carried with the KV
            cached = 0 if st.mode == "decode" else st.prefix_cache.match(toks)
            st.inflight_tokens += p_tokens
        try:
            if st.mode == "prefill":
                time.sleep(st.latency_s() / 2)   # the prefill computes, then the blocks enter the cache
                with st.lock:
                    st.prefix_cache.insert(toks)
                    st.kv_rooms[str(body.get("bootstrap_room"))] = {"cached": cached, "prompt_tokens": p_tokens,
                                                                    "time": time.monotonic()}
                    for room in [r for r, v in st.kv_rooms.items() if time.monotonic() - v["time"] > 600]:
                        del st.kv_rooms[room]
            elif st.mode == "decode":
                try:
                    cached = self._pull_kv(body, p_tokens)
                except (RuntimeError, OSError, ValueError) as exc:
                    log("ERROR", "Decode transfer failed: %s" % exc)
                    with st.lock:
                        st.counters["kv_transfer_failed"] += 1
                    entry["status"] = 500
                    st.record(entry)
                    return self._send(500, {"error": {"message": "KVTransferError: %s" % exc}})
            else:
                with st.lock:
                    st.prefix_cache.insert(toks)
            text = "" if st.mode == "prefill" else st.answer_text()
            words = text.split(" ") if text else []
            sp = body.get("sampling_params") or {}
            if words and sp.get("ignore_eos") and sp.get("max_new_tokens"):
                # bench_serving sends ignore_eos + max_new_tokens: exactly that many tokens, like the real server
                n = int(sp["max_new_tokens"])
                words = (words * (n // len(words) + 1))[:n]
                text = " ".join(words)
            c_tokens = len(words)
            usage = {"prompt_tokens": p_tokens, "completion_tokens": c_tokens, "total_tokens": p_tokens + c_tokens,
                     "prompt_tokens_details": {"cached_tokens": cached}}
            latency = st.latency_s() if st.mode != "prefill" else 0.0
            if body.get("stream"):
                status = self._stream(path, body, rid, words, usage, latency)
            else:
                time.sleep(latency)
                status = self._send(200, self._full_response(path, body, rid, text, usage, t0)) or 200
            entry["status"] = status
            entry["cached_tokens"] = cached
            st.record(entry)
            with st.lock:
                st.counters["requests_ok"] += 1
                st.counters["prompt_tokens"] += p_tokens
                st.counters["generation_tokens"] += c_tokens
                st.counters["cached_tokens"] += cached
                st.counters["realtime_decode_tokens"] += 0 if body.get("stream") else c_tokens
                st.latencies.append(time.monotonic() - t0)
                del st.latencies[:-1000]
            return None
        finally:
            with st.lock:
                st.inflight_tokens -= p_tokens

    def _pull_kv(self, body, p_tokens):
        """Decode side of the PD hand-off: wait for the prefill's KV of this bootstrap_room and pull it. Over RDMA
        the bytes appear on the NIC counters of both sides' --disaggregation-ib-device; over TCP they do not."""
        st = self.state
        host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
        if not host or room is None:
            return 0
        transport = st.transport()
        url = "http://%s:%s/stub/kv?room=%s&transport=%s&devices=%s" % (
            "[%s]" % host if ":" in str(host) else host, port or 8998, room, transport, ",".join(st.ib_devices))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    info = json.loads(resp.read() or b"{}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    time.sleep(0.02)
                    continue
                raise RuntimeError("KV transfer failed: prefill answered %d" % exc.code) from exc
            if info.get("transport") == "rdma":
                bump_nic_counters(st.sysfs_root, st.active_devices(), "port_rcv_data", info["kv_bytes"])
            with st.lock:
                st.counters["kv_pulled_bytes"] += info["kv_bytes"]
                st.counters["kv_pulled_%s" % info.get("transport")] += 1
            return int(info.get("cached", 0))
        raise RuntimeError("Failed to get kvcache from prefill instance, it might be dead (stub: room %s)" % room)

    def _full_response(self, path, body, rid, text, usage, t0):
        st = self.state
        now = int(time.time())
        if path == "/v1/chat/completions":
            return {"id": "chatcmpl-%s" % rid, "object": "chat.completion", "created": now,
                    "model": st.served_model_name,
                    "choices": [{"index": 0, "message": {"role": "assistant", "content": text,
                                                         "reasoning_content": None, "tool_calls": None},
                                 "logprobs": None, "finish_reason": "stop", "matched_stop": None}],
                    "usage": usage}
        if path == "/v1/completions":
            return {"id": "cmpl-%s" % rid, "object": "text_completion", "created": now, "model": st.served_model_name,
                    "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop",
                                 "matched_stop": None}], "usage": usage}
        return {"text": text, "meta_info": {"id": rid, "finish_reason": {"type": "stop", "matched": None},
                                            "prompt_tokens": usage["prompt_tokens"],
                                            "completion_tokens": usage["completion_tokens"],
                                            "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                                            "e2e_latency": round(time.monotonic() - t0, 4)}}

    def _stream(self, path, body, rid, words, usage, latency):
        st = self.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        now = int(time.time())
        steps = max(1, len(words))
        sent = []

        def event(obj):
            self._chunk("data: %s\n\n" % json.dumps(obj))

        if path == "/v1/chat/completions":
            base = {"id": "chatcmpl-%s" % rid, "object": "chat.completion.chunk", "created": now,
                    "model": st.served_model_name}
            event(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}]))
        for i, w in enumerate(words):
            time.sleep(latency / steps)
            with st.lock:
                st.counters["realtime_decode_tokens"] += 1
            piece = w if i == 0 else " " + w
            sent.append(piece)
            if path == "/v1/chat/completions":
                event(dict(base, choices=[{"index": 0, "delta": {"content": piece}, "logprobs": None,
                                           "finish_reason": None}]))
            elif path == "/v1/completions":
                event({"id": "cmpl-%s" % rid, "object": "text_completion", "created": now,
                       "model": st.served_model_name,
                       "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]})
            else:
                event({"text": "".join(sent), "meta_info": {"id": rid, "finish_reason": None,
                                                             "prompt_tokens": usage["prompt_tokens"],
                                                             "completion_tokens": i + 1}})
        if not words:
            time.sleep(latency)
        if path == "/v1/chat/completions":
            event(dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]))
            if (body.get("stream_options") or {}).get("include_usage"):
                event(dict(base, choices=[], usage=usage))
        elif path == "/v1/completions":
            event({"id": "cmpl-%s" % rid, "object": "text_completion", "created": now, "model": st.served_model_name,
                   "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}]})
        else:
            event({"text": "".join(sent), "meta_info": {"id": rid, "finish_reason": {"type": "stop"},
                                                         "prompt_tokens": usage["prompt_tokens"],
                                                         "completion_tokens": len(words),
                                                         "cached_tokens": usage["prompt_tokens_details"][
                                                             "cached_tokens"]}})
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return 200

    def _metrics(self):
        st = self.state
        with st.lock:
            c = dict(st.counters)
            running = max(0, st.inflight - 1)
            tokens = st.inflight_tokens
            lat = list(st.latencies)
        prompt, cached = c.get("prompt_tokens", 0), c.get("cached_tokens", 0)
        hit = (cached / prompt) if prompt else 0.0
        labels = 'model_name="%s",engine_type="%s",tp_rank="0",pp_rank="0"' % (st.served_model_name, st.engine_type)
        lines = ["# TEST DOUBLE: sglang-stub %s (%s) - these figures are synthetic" % (st.version, st.instance)]

        def metric(name, mtype, value, help_):
            lines.extend(["# HELP sglang:%s %s" % (name, help_), "# TYPE sglang:%s %s" % (name, mtype),
                          "sglang:%s{%s} %s" % (name, labels, value)])

        metric("num_running_reqs", "gauge", running, "The number of running requests.")
        metric("num_queue_reqs", "gauge", 0, "The number of requests in the waiting queue.")
        metric("num_used_tokens", "gauge", tokens, "The number of used tokens.")
        metric("token_usage", "gauge", round(tokens / 180224.0, 6), "The token usage.")
        metric("gen_throughput", "gauge", 42.0 if running else 0.0, "The generation throughput (token/s).")
        metric("cache_hit_rate", "gauge", round(hit, 6), "The prefix cache hit rate.")
        metric("prompt_tokens_total", "counter", prompt, "Number of prefill tokens processed.")
        metric("generation_tokens_total", "counter", c.get("generation_tokens", 0),
               "Number of generation tokens processed.")
        metric("cached_tokens_total", "counter", cached, "Number of cached prompt tokens.")
        metric("num_requests_total", "counter", c.get("requests_ok", 0), "Number of requests processed.")
        lines.extend(["# HELP sglang:realtime_tokens_total Tokens processed, updated per batch.",
                      "# TYPE sglang:realtime_tokens_total counter",
                      'sglang:realtime_tokens_total{%s,mode="decode"} %d' % (labels, c.get("realtime_decode_tokens", 0)),
                      'sglang:realtime_tokens_total{%s,mode="prefill_cache"} %d' % (labels, cached),
                      'sglang:realtime_tokens_total{%s,mode="prefill_compute"} %d' % (labels, prompt - cached)])
        if st.mode == "prefill":
            lines.extend(["# HELP sglang:kv_transfer_total_mb KV transfer size per request (MB).",
                          "# TYPE sglang:kv_transfer_total_mb histogram",
                          "sglang:kv_transfer_total_mb_sum{%s} %.6f" % (labels, c.get("kv_transfer_mb_sum", 0.0)),
                          "sglang:kv_transfer_total_mb_count{%s} %d" % (labels, c.get("kv_transfer_count", 0))])
        if st.mode in ("prefill", "decode"):
            metric("num_transfer_failed_reqs_total", "counter", c.get("kv_transfer_failed", 0),
                   "Number of failed KV transfers.")
        metric("num_aborted_requests_total", "counter", c.get("generation_errors", 0), "Number of requests aborted.")
        buckets = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
        lines += ["# HELP sglang:e2e_request_latency_seconds Histogram of End-to-end request latency in seconds",
                  "# TYPE sglang:e2e_request_latency_seconds histogram"]
        for b in buckets:
            lines.append('sglang:e2e_request_latency_seconds_bucket{%s,le="%s"} %d' % (
                labels, b, sum(1 for x in lat if x <= b)))
        lines.append('sglang:e2e_request_latency_seconds_bucket{%s,le="+Inf"} %d' % (labels, len(lat)))
        lines.append("sglang:e2e_request_latency_seconds_sum{%s} %.6f" % (labels, sum(lat)))
        lines.append("sglang:e2e_request_latency_seconds_count{%s} %d" % (labels, len(lat)))
        return "\n".join(lines) + "\n"


class BootstrapHandler(BaseHTTPRequestHandler):
    """Trivial stand-in for the prefill bootstrap server (disaggregation-bootstrap-port)."""
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, fmt, *args):  # noqa: N802
        log("INFO", "bootstrap %s - %s" % (self.client_address[0], fmt % args))

    def _reply(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        if self.path.startswith("/stub/kv"):
            return self._kv()
        body = b"OK" if self.path.startswith("/health") else json.dumps(
            {"test_double": True, "instance": self.state.instance, "bootstrap_port": self.state.bootstrap_port}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _kv(self):
        st = self.state
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
        with st.lock:
            info = st.kv_rooms.pop(q.get("room"), None)
        if info is None:
            code, body = 404, {"error": "room not ready"}
        else:
            mine = st.transport()
            if mine != q.get("transport"):
                code, body = 500, {"error": "NotSupportedTransport: prefill %s, decode %s" % (mine, q.get("transport"))}
            else:
                nbytes = info["prompt_tokens"] * st.kv_bytes_per_token
                if mine == "rdma":
                    bump_nic_counters(st.sysfs_root, st.active_devices(), "port_xmit_data", nbytes)
                with st.lock:
                    st.counters["kv_transfer_mb_sum"] += nbytes / 1048576.0
                    st.counters["kv_transfer_count"] += 1
                code, body = 200, {"cached": info["cached"], "kv_bytes": nbytes, "transport": mine}
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_POST = _reply  # noqa: N815


def make_server(host, port, handler_cls):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 128

    return Server((host, port), handler_cls)


def banner(st, argv):
    lines = [
        "=" * 78,
        "  THIS IS A TEST DOUBLE (sglang-stub), NOT SGLang. No model is loaded, no GPU is used.",
        "  emulating: sglang %s serve   instance: %s   mode: %s" % (st.version, st.instance, st.mode),
        "  served_model_name=%s tp_size=%d dp_size=%d bootstrap_port=%s" % (
            st.served_model_name, st.tp_size, st.dp_size, st.bootstrap_port if st.mode == "prefill" else "-"),
        "  control dir: %s (files: fault, latency_ms)   pid %d" % (st.control_dir, os.getpid()),
        "  argv: %s" % " ".join(argv),
        "=" * 78,
    ]
    sys.stderr.write("\n".join(lines) + "\n")
    sys.stderr.flush()


def cuda_init_error(env=None):
    """What CUDA initialisation would say on an emulated host (sandbox/hwemu), or None when it would succeed.

    Like a real host after a power cycle: without nvidia_uvm loaded (no /dev/nvidia-uvm; emulated by
    <HWEMU_RUN_DIR>/nvidia-uvm, created by hwemu's nvidia-modprobe -u) CUDA cannot initialise; while the NVLink fabric
    is not configured (nvidia-smi fabric state not Completed) CUDA fails with error 802. No hwemu: no check.
    """
    env = os.environ if env is None else env
    root = env.get("SGLANG_STUB_HWEMU_ROOT", "/opt/hwemu")
    modprobe = os.path.join(root, "bin", "nvidia-modprobe")
    if not os.path.exists(modprobe):
        return None
    run_dir = env.get("HWEMU_RUN_DIR") or "/run/hwemu"
    if not os.path.exists(os.path.join(run_dir, "nvidia-uvm")):
        return ("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu. "
                "(emulated: nvidia_uvm not loaded, %s/nvidia-uvm absent; load it with nvidia-modprobe -u -c=0)"
                % run_dir)
    import subprocess  # noqa: PLC0415 - only on emulated hosts
    try:
        res = subprocess.run([os.path.join(root, "bin", "nvidia-smi"), "--query-gpu=fabric.state",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=False,
                             env=dict(env))
        states = [x.strip() for x in res.stdout.splitlines() if x.strip()]
    except (OSError, subprocess.TimeoutExpired) as exc:
        states = ["unknown (%s)" % exc]
    bad = [x for x in states if x not in ("Completed", "N/A", "[N/A]")]
    if bad:
        return ("RuntimeError: CUDA error: system not yet initialized (cudaErrorSystemNotReady, error 802) "
                "(emulated: GPU fabric state %s, not Completed)" % bad[0])
    return None


def start_refusal(faults, argv, api_key):
    """The start-time faults (issue 23 rollback tests): a key or a flag this server refuses. The key is never logged."""
    if "refuse_api_key" in faults and api_key:
        return "fault refuse_api_key: this server refuses the --api-key it was started with; exiting 1"
    for fault in sorted(faults):
        flag = fault[len("refuse_flag:"):] if fault.startswith("refuse_flag:") else None
        if flag and any(a == flag or a.startswith(flag + "=") for a in argv):
            return "fault refuse_flag:%s: this server refuses %s at start; exiting 1" % (flag, flag)
    return None


def serve(version, argv, env=None):
    ns, warnings = parse_serve_args(version, argv)
    for w in warnings:
        log("WARNING", w)
    err = cuda_init_error(env)
    if err:
        log("ERROR", err)
        return 1
    st = StubState(ns, version, env)
    # like SGLang 0.5.17 (srt/entrypoints/engine.py) at INFO: the API key appears in this line (issue 15 redaction test)
    log("INFO", "server_args=ServerArgs(model_path=%r, host=%r, port=%d, api_key=%r)" % (st.model_path, st.host, st.port, st.api_key))
    banner(st, argv)
    try:
        os.makedirs(st.control_dir, exist_ok=True)
        with open(os.path.join(st.control_dir, "pid"), "w", encoding="utf-8") as fh:
            fh.write("%d\n" % os.getpid())
    except OSError as exc:
        log("WARNING", "control dir %s not usable: %s" % (st.control_dir, exc))
    refused = start_refusal(st.faults(), argv, st.api_key)
    if refused:
        log("ERROR", refused)
        return 1
    unknown = {f for f in st.faults() if not f.startswith("refuse_flag:")} - set(KNOWN_FAULTS)
    if unknown:
        log("WARNING", "unknown stub faults ignored: %s (known: %s)" % (sorted(unknown), ", ".join(KNOWN_FAULTS)))

    if st.mode in ("prefill", "decode"):
        # Mooncake's startup lines (facts 4.1): discovery over the given devices, then the transport chosen
        hcas = st.active_devices()
        log("INFO", "Auto-discovering topology... (stub: devices %s)" % (",".join(st.ib_devices) or "auto"))
        log("INFO", "Topology discovery complete. Found %d HCAs." % len(hcas))
        if not hcas and st.env.get("MC_FORCE_HCA") == "1":
            log("ERROR", "MC_FORCE_HCA=1 and no HCA found: Mooncake Transfer Engine initialization failed.")
            return 1
        log("INFO", "Using RDMA transport (RoCE/iWARP)" if hcas else "Using TCP transport (no HCA detected)")
    handler = type("BoundHandler", (Handler,), {"state": st})
    try:
        httpd = make_server(st.host, st.port, handler)
    except OSError as exc:
        log("ERROR", "cannot listen on %s:%d: %s" % (st.host, st.port, exc))
        return 1
    servers = [httpd]
    if st.mode == "prefill":
        bh = type("BoundBootstrap", (BootstrapHandler,), {"state": st})
        try:
            boot = make_server(st.host, st.bootstrap_port, bh)
        except OSError as exc:
            log("ERROR", "cannot listen on bootstrap port %s:%d: %s" % (st.host, st.bootstrap_port, exc))
            httpd.server_close()
            return 1
        servers.append(boot)
        threading.Thread(target=boot.serve_forever, name="bootstrap", daemon=True).start()
        log("INFO", "bootstrap server listening on %s:%d" % (st.host, st.bootstrap_port))

    def on_signal(signum, _frame):
        if st.draining:
            return
        st.draining = True
        log("INFO", "received %s: stop accepting, finishing %d in-flight request(s)" % (
            signal.Signals(signum).name, max(0, st.inflight)))
        threading.Thread(target=httpd.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def loader():
        time.sleep(max(0.0, st.load_seconds))
        if "die_after_load" in st.faults():
            log("ERROR", "fault die_after_load: exiting 1 as a crashed server would")
            os._exit(1)  # pylint: disable=protected-access
        log("INFO", "The server is fired up and ready to roll! (stub: simulated load of %.1fs done)" % st.load_seconds)

    threading.Thread(target=loader, daemon=True).start()
    log("INFO", "Uvicorn running on http://%s:%d (sglang-stub)" % (st.host, st.port))
    httpd.serve_forever(poll_interval=0.2)
    # Draining: the listening socket is closed, in-flight requests finish.
    for s in servers:
        s.server_close()
    deadline = time.monotonic() + st.drain_seconds
    while time.monotonic() < deadline:
        with st.lock:
            busy = st.inflight
        if busy <= 0:
            break
        time.sleep(0.05)
    with st.lock:
        left = st.inflight
    if left > 0:
        log("WARNING", "drain timeout after %.0fs with %d request(s) still in flight" % (st.drain_seconds, left))
    log("INFO", "shutdown complete (stub)")
    return 0


USAGE = """usage: sglang {serve,version} ...   (TEST DOUBLE sglang-stub)
  sglang serve [server args]   parse args like the real sglang %s parser, then serve the HTTP API
  sglang version               print the emulated version
"""


def main(argv=None, argv0=None):
    argv = sys.argv[1:] if argv is None else argv
    argv0 = sys.argv[0] if argv0 is None else argv0
    version = version_from_name(argv0)
    versions = available_versions()
    if version is None:
        sys.stderr.write("sglang-stub: no version: call it as sglang-<version> or set SGLANG_STUB_VERSION "
                         "(catalogs: %s)\n" % ", ".join(versions))
        return 2
    if version not in versions:
        sys.stderr.write("sglang-stub: no option catalog for version %s in %s (have: %s)\n"
                         % (version, OPTIONS_DIR, ", ".join(versions)))
        return 2
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE % version)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "version":
        sys.stdout.write("sglang version: %s\ngit revision: sglang-stub (TEST DOUBLE, not SGLang)\n" % version)
        return 0
    if cmd == "serve":
        if os.environ.get("SGLANG_STUB_CHECK_ONLY", "") not in ("", "0"):
            # Preflight in the sandbox: the same accept/refuse verdict, nothing started.
            _ns, warnings = parse_serve_args(version, rest)
            for w in warnings:
                log("WARNING", w)
            sys.stdout.write("OK: sglang %s parser (sglang-stub catalog) accepts the command line\n" % version)
            return 0
        return serve(version, rest)
    sys.stderr.write("sglang: error: argument command: invalid choice: %r (choose from 'serve', 'version')\n" % cmd)
    return 2


if __name__ == "__main__":
    sys.exit(main())
