#!/usr/bin/env python3
"""SGLang TEST DOUBLE: `sglang serve ARGV` / `sglang version` for the b300-rollout sandbox.

THIS IS NOT SGLANG. It parses the server command line with argparse built from the option catalog dumped from the
real `sglang serve` parser of the same version (options/server-options-<ver>.json, see
tools/sglang_argcheck/dump_options.py), so unknown flags, bad choices, bad types and prefix abbreviations behave as
they do in the real parser (exit 2 with an argparse message). Then it serves the SGLang HTTP API that the real
sglang-router 0.3.2 and our roles use, with deterministic answers that name the instance.

Python 3.11 standard library only (the sandbox hosts have no pip packages).

Behaviour like SGLang 0.5.17/0.5.18 where the project meets it (README.md "Contract", with file:line per version):
port bound after the load, warm-up (SGLANG_WARMUP_TIMEOUT, kill on failure), /health as a 1-token generation,
/flush_cache only when idle, the real metric families, /v1/loads, PD bootstrap_room and the prefill's KV-transfer
queue, reasoning_content, a child "scheduler" process and SIGTERM semantics, uvicorn keep-alive.

Environment knobs (all optional; README.md has the full table):
  SGLANG_STUB_VERSION         version when the executable name carries none (sglang-0.5.17 -> 0.5.17)
  SGLANG_STUB_TIME_SCALE      factor on every real SGLang duration reproduced (default 0.1; 1 = real timings)
  SGLANG_STUB_LOAD_SECONDS    simulated model load, the port is not bound meanwhile (default 2)
  SGLANG_STUB_WARMUP_SECONDS  first forward pass in real seconds (scaled; default 2)
  SGLANG_STUB_LATENCY_MS      time each inference request takes (default 0)
  SGLANG_STUB_KV_TRANSFER_MS  time one PD KV transfer takes (default 0)
  SGLANG_STUB_STEP_MS         the batch step-time model (tools/sweep): one forward step of a small running batch in
                                sandbox ms (default 0 = off); see StubState.step_s for the model and its source
  SGLANG_STUB_KNEE_BATCH      running batch where that step turns compute-bound (default 64)
  SGLANG_STUB_PREFILL_US_PER_TOKEN  prefill time per uncached prompt token, sandbox us (default 0; step model only)
  SGLANG_STUB_ANSWER_BOOK     JSON question set (tools/quality-gate's format): a prompt found there is answered
                                with its item's reference answer (tools/quality-gate, docs/go-live-tuning.md)
  SGLANG_STUB_DEGRADE         TYPE:FRACTION[,...]: that fraction of a task type's answer-book items (rounded up,
                                chosen by a hash of the item id) answered wrong: one task type made worse
  SGLANG_STUB_FAULT           space/comma separated faults: unhealthy, error500, hang, die_after_load,
                                unhealthy_after_restart (= unhealthy for a process started after the control file
                                was written; the process already running stays healthy: a restart that never comes up),
                                refuse_api_key (exit 1 at start when started with --api-key: a key this server refuses),
                                refuse_flag:--NAME (exit 1 at start when argv holds --NAME: a flag it refuses at start)
  SGLANG_STUB_CONTROL_DIR     control directory (default /run/sglang-stub/<port>); files read on every request:
                                fault, latency_ms, kv_transfer_ms, warmup_seconds, health_forward_ms,
                                mooncake_transport, step_ms, knee_batch, degrade, answer_book (replace the env
                                value while present)
  SGLANG_STUB_HANG_MAX_SECONDS  a hung request gives up (504) after this long (default 600)
  SGLANG_STUB_INSTANCE_NAME   name in the answer text (default <hostname>:<port> when --host is a wildcard)
  SGLANG_STUB_CHECK_ONLY=1    `serve ARGV` only parses (exit 0 accepted / 2 refused) and starts nothing
Real variables read like SGLang: SGLANG_WARMUP_TIMEOUT, SGLANG_HEALTH_CHECK_TIMEOUT,
SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, SGLANG_TIMEOUT_KEEP_ALIVE, SGLANG_DISAGGREGATION_WAITING_TIMEOUT,
SGL_FORCE_SHUTDOWN, MC_FORCE_TCP, MC_FORCE_HCA.
"""

import argparse
import collections
import contextlib
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
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
    from ansible_collections.b300.rollout.plugins.module_utils.sglang import argparse_abbrev
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
    opts = parser._option_string_actions  # argparse keeps its option map private
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

# Real constants (README.md "Contract" table cites file:line per version).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"          # srt/disaggregation/utils.py: warm-up and /health requests of PD workers
HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"  # srt/constants.py
DEFAULT_TIME_SCALE = 0.1                 # the sandbox's default; SGLANG_STUB_TIME_SCALE=1 gives the real timings
KIMI_K3_THINK_CLOSE = "<|close|>think<|sep|>"       # srt/function_call/kimik3_format.py
KIMI_K3_RESPONSE_OPEN = "<|open|>response<|sep|>"
FLUSH_OK_TEXT = ("Cache flushed.\nPlease check backend logs for more details. "
                 "(When there are running or waiting requests, the operation will not be performed.)\n")


def log(level, msg):
    """SGLang's log format: `[YYYY-mm-dd HH:MM:SS] message` on stderr, no level (srt/utils/common.py configure_logger).
    `level` is kept for the reader of this file only."""
    del level
    ts = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        sys.stderr.write("[%s] %s\n" % (ts, msg))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def env_bool(env, name, default):
    """srt/environ.py EnvBool: true/1/yes/y, false/0/no/n (case-insensitive), anything else is an error."""
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    v = raw.lower()
    if v in ("true", "1", "yes", "y"):
        return True
    if v in ("false", "0", "no", "n"):
        return False
    raise ValueError('"%s" is not a valid boolean value' % raw)


def read_model_config(model_path):
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
        return cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        return {}


class StubState:
    def __init__(self, ns, version, env=None):
        env = os.environ if env is None else env
        self.env = env
        self.version = version
        self.ns = ns
        self.host = getattr(ns, "host", None) or "127.0.0.1"
        self.port = int(getattr(ns, "port", None) or 30000)
        self.model_path = getattr(ns, "model_path", None) or "stub-model"
        self.tokenizer_path = getattr(ns, "tokenizer_path", None) or self.model_path
        self.served_model_name = getattr(ns, "served_model_name", None) or self.model_path
        self.tp_size = int(getattr(ns, "tp_size", None) or 1)
        self.dp_size = int(getattr(ns, "dp_size", None) or 1)
        self.pp_size = int(getattr(ns, "pp_size", None) or 1)
        self.mode = getattr(ns, "disaggregation_mode", None) or "null"
        self.transfer_backend = getattr(ns, "disaggregation_transfer_backend", None) or "mooncake"
        self.bootstrap_port = int(getattr(ns, "disaggregation_bootstrap_port", None) or 8998)
        self.api_key = getattr(ns, "api_key", None)
        self.enable_metrics = bool(getattr(ns, "enable_metrics", False))
        self.enable_cache_report = bool(getattr(ns, "enable_cache_report", False))
        self.context_length = getattr(ns, "context_length", None) or 32768
        self.reasoning_parser = getattr(ns, "reasoning_parser", None)
        self.tool_call_parser = getattr(ns, "tool_call_parser", None)
        self.skip_server_warmup = bool(getattr(ns, "skip_server_warmup", False))
        self.max_running_requests = int(getattr(ns, "max_running_requests", None) or 1024)
        self.model_config = read_model_config(self.model_path)
        if env.get("SGLANG_STUB_INSTANCE_NAME"):
            self.instance = env["SGLANG_STUB_INSTANCE_NAME"]
        elif self.host in ("0.0.0.0", "::", ""):
            self.instance = "%s:%d" % (socket.gethostname(), self.port)
        else:
            self.instance = "%s:%d" % (self.host, self.port)
        # --- time: stub knobs in sandbox seconds, real SGLang constants scaled by time_scale ------------------------
        self.time_scale = float(env.get("SGLANG_STUB_TIME_SCALE") or DEFAULT_TIME_SCALE)
        if self.time_scale <= 0:
            raise ValueError("SGLANG_STUB_TIME_SCALE must be > 0, got %r" % env.get("SGLANG_STUB_TIME_SCALE"))
        self.load_seconds = float(env.get("SGLANG_STUB_LOAD_SECONDS", "2"))
        self.hang_max_seconds = float(env.get("SGLANG_STUB_HANG_MAX_SECONDS", "600"))
        # real environment variables, parsed like SGLang (int() / EnvFloat / EnvBool / EnvInt)
        self.health_check_timeout = int(env.get("SGLANG_HEALTH_CHECK_TIMEOUT", 20))
        self.health_generation = env_bool(env, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", True)
        self.warmup_timeout = float(env.get("SGLANG_WARMUP_TIMEOUT") or -1)
        self.keep_alive = int(env.get("SGLANG_TIMEOUT_KEEP_ALIVE") or 5)
        self.waiting_timeout = int(env.get("SGLANG_DISAGGREGATION_WAITING_TIMEOUT") or 300)
        # the prefill's bound on a request whose decode never bootstraps it (EnvInt(300), environ.py 17:413 / 18:609;
        # conn.py 17:237, checked from the request's arrival in _check_bootstrap_timeout, 17:1203-1217)
        self.bootstrap_timeout = int(env.get("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT") or 300)
        self.control_dir = env.get("SGLANG_STUB_CONTROL_DIR") or "/run/sglang-stub/%d" % self.port
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.lock = threading.Lock()
        self.idle_cv = threading.Condition(self.lock)
        self.inflight = 0                    # HTTP requests being handled (any path)
        self.inflight_tokens = 0
        # --- the emulated scheduler (srt/managers/scheduler.py) and tokenizer manager state ------------------------
        self.server_status = "Starting"      # ServerStatus: Starting -> Up (warm-up passed) / UnHealthy
        self.gracefully_exit = False         # set by the SIGTERM handler (tokenizer_manager.py SignalHandler)
        self.rid_to_state = {}               # tokenizer manager: every request in flight, health checks included
        self.running = 0                     # scheduler: requests in a forward (running batch + waiting queue)
        self.health_running = 0              # /health generations the scheduler actually runs (idle scheduler)
        self.prefill_inflight = {}           # prefill: room -> request waiting for its KV to be pulled (inflight queue)
        self.decode_transfer = 0             # decode: requests waiting for the prefill's KV (transfer queue)
        self.last_output = 0.0               # tokenizer_manager.last_receive_tstamp (monotonic here)
        self.first_forward_done = False
        self.flush_pending = False
        self.scheduler_proc = None
        self.counters = collections.Counter()
        self.requests = collections.deque(maxlen=100)
        self.last_bootstrap = None
        self.latencies = []
        # metrics: series appear on first observation, like prometheus_client labelled metrics
        self.tok_metrics = {}                # (name, is_streaming) -> value
        self.cached_by_source = collections.Counter()
        self.e2e = {}                        # is_streaming -> [latencies]
        self.realtime = collections.Counter()
        self.kv_mb = []                      # one entry per transfer: MB per sending rank
        # acceptance (roles/acceptance): an honest prefix cache, PD KV hand-off and emulated NIC counters
        capacity = int(env.get("SGLANG_STUB_CACHE_TOKENS") or getattr(ns, "max_total_tokens", None) or 1000000)
        self.capacity_tokens = capacity
        host = 0
        if getattr(ns, "enable_hierarchical_cache", False):
            host = int(capacity * float(getattr(ns, "hicache_ratio", None) or 2.0))
        self.prefix_cache = PrefixCache(int(getattr(ns, "page_size", None) or 1), capacity, host)
        self.engine_type = {"prefill": "prefill", "decode": "decode"}.get(self.mode, "unified")
        self.ib_devices = [d.strip() for d in re.split(r"[,\s]+", str(getattr(ns, "disaggregation_ib_device", None)
                                                                       or "")) if d.strip() and ":" not in d]
        self.sysfs_root = env.get("SGLANG_STUB_SYSFS_ROOT", "/opt/hwemu/sys")
        self.kv_bytes_per_token = int(env.get("SGLANG_STUB_KV_BYTES_PER_TOKEN", "4096"))
        # go-live tuning (tools/sweep, tools/quality-gate): the running batch under the step-time model (requests past
        # --max-running-requests wait, as in the scheduler's waiting queue) and the answer book
        self.batch = 0
        self.batch_slots = threading.BoundedSemaphore(self.max_running_requests)
        self.answer_book = load_answer_book(env.get("SGLANG_STUB_ANSWER_BOOK"))
        self._book_file = (None, {})         # (mtime, book) of the control file answer_book

    # -- time ----------------------------------------------------------------------------------------------------
    def real(self, seconds):
        """A duration of real SGLang (seconds) on the stub's clock."""
        return float(seconds) * self.time_scale

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

    def _ms_knob(self, name, env_name, default="0"):
        raw = self._control(name)
        if raw is None:
            raw = self.env.get(env_name, default)
        try:
            return max(0.0, float(raw)) / 1000.0
        except ValueError:
            return 0.0

    def latency_s(self):
        return self._ms_knob("latency_ms", "SGLANG_STUB_LATENCY_MS")

    def kv_transfer_s(self):
        return self._ms_knob("kv_transfer_ms", "SGLANG_STUB_KV_TRANSFER_MS")

    def step_model(self):
        """(step_s, knee_batch) of the batch step-time model, or None when SGLANG_STUB_STEP_MS is 0 (off)."""
        step = self._ms_knob("step_ms", "SGLANG_STUB_STEP_MS")
        if step <= 0:
            return None
        raw = self._control("knee_batch") or self.env.get("SGLANG_STUB_KNEE_BATCH") or "64"
        try:
            knee = max(1.0, float(raw))
        except ValueError:
            knee = 64.0
        return step, knee

    def step_s(self):
        """One forward step of the current running batch B, in sandbox seconds (0 with the model off).

        The roofline model of a decode step (kipply, "Transformer Inference Arithmetic", 2022; Yuan et al., "LLM
        Inference Unveiled: Survey and Roofline Model Insights", arXiv:2402.16363, 2024): a step takes
        max(bytes moved / memory bandwidth, FLOPs / peak compute). The bytes (weights, read once per step) barely
        depend on B; the FLOPs grow linearly with B. So step(B) = step_ms * max(1, B / knee_batch): flat (memory
        bound, throughput B/step grows linearly) up to knee_batch, then linear (compute bound, throughput flat and
        every request slower). Simplified: the KV-cache reads that also grow with B and context are left out."""
        model = self.step_model()
        if model is None:
            return 0.0
        step, knee = model
        with self.lock:
            b = self.batch
        return step * max(1.0, b / knee)

    @contextlib.contextmanager
    def batch_slot(self):
        """A place in the running batch under the step model: past --max-running-requests the request waits, like
        the scheduler's waiting queue (its wait is time to first token)."""
        if self.step_model() is None:
            yield
            return
        self.batch_slots.acquire()
        with self.lock:
            self.batch += 1
        try:
            yield
        finally:
            with self.lock:
                self.batch -= 1
            self.batch_slots.release()

    def prefill_s(self, uncached_tokens):
        """The prefill forward of the step model: one step plus SGLANG_STUB_PREFILL_US_PER_TOKEN per uncached
        prompt token (0 with the model off)."""
        if self.step_model() is None:
            return 0.0
        try:
            per = max(0.0, float(self.env.get("SGLANG_STUB_PREFILL_US_PER_TOKEN") or 0)) / 1e6
        except ValueError:
            per = 0.0
        return self.step_s() + uncached_tokens * per

    def degraded(self):
        """{task_type: fraction} of SGLANG_STUB_DEGRADE (or the control file `degrade`)."""
        raw = self._control("degrade")
        if raw is None:
            raw = self.env.get("SGLANG_STUB_DEGRADE", "")
        out = {}
        for part in re.split(r"[\s,]+", raw):
            name, _, frac = part.partition(":")
            try:
                out[name] = min(1.0, max(0.0, float(frac)))
            except ValueError:
                continue
        return out

    def current_answer_book(self):
        """The control file `answer_book` (the question set's JSON itself, copied in by the operator: the sandbox
        hosts' units set no SGLANG_STUB_ANSWER_BOOK), re-read when it changes; else the one of the environment."""
        path = os.path.join(self.control_dir, "answer_book")
        try:
            mtime = os.path.getmtime(path)
        except OSError:
            return self.answer_book
        if self._book_file[0] != mtime:
            try:
                with open(path, encoding="utf-8") as fh:
                    self._book_file = (mtime, answer_book_of(json.load(fh)))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log("WARNING", "stub answer_book %s unreadable (%s): ignored" % (path, exc))
                self._book_file = (mtime, {})
        return self._book_file[1]

    def book_answer(self, prompt):
        """The answer-book answer for this prompt, or None when the prompt is not in the book."""
        item = self.current_answer_book().get(prompt.strip())
        if item is None:
            return None
        frac = self.degraded().get(item["task_type"], 0.0)
        if frac > 0 and item["rank"] < math.ceil(frac * item["of"]):
            return WRONG_ANSWER
        return item["reference"]

    def health_forward_s(self):
        return self._ms_knob("health_forward_ms", "SGLANG_STUB_HEALTH_FORWARD_MS", "50")

    def warmup_seconds(self):
        """Simulated first forward pass (cold JIT / graph warm-up), in REAL seconds (scaled like the timeout)."""
        raw = self._control("warmup_seconds")
        if raw is None:
            raw = self.env.get("SGLANG_STUB_WARMUP_SECONDS", "2")
        try:
            return max(0.0, float(raw))
        except ValueError:
            return 0.0

    def reasoning_tokens(self):
        try:
            return max(0, int(self.env.get("SGLANG_STUB_REASONING_TOKENS", "24")))
        except ValueError:
            return 24

    def loaded(self):
        return time.monotonic() - self.started >= self.load_seconds

    def healthy(self):
        return self.server_status == "Up" and "unhealthy" not in self.faults() and not self.gracefully_exit

    def answer_text(self):
        return "stub %s on %s (sglang %s, %s)" % (self.served_model_name, self.instance, self.version, self.mode)

    def is_vlm(self):
        archs = self.model_config.get("architectures") or []
        return any("ForConditionalGeneration" in str(a) for a in archs)

    def record(self, entry):
        with self.lock:
            self.requests.append(entry)
            if entry.get("bootstrap_room") is not None or entry.get("bootstrap_host") is not None:
                self.last_bootstrap = {k: entry.get(k) for k in ("bootstrap_room", "bootstrap_host", "bootstrap_port")}

    def output(self):
        """The scheduler produced output (tokenizer_manager.handle_loop sets last_receive_tstamp)."""
        with self.lock:
            self.last_output = time.monotonic()

    # -- scheduler queues ----------------------------------------------------------------------------------------
    def is_fully_idle(self):
        """scheduler.py is_fully_idle(): nothing running or waiting; a prefill's KV-transfer (inflight) queue and a
        decode's transfer queue count as busy (for_health_check=False, what /flush_cache asks)."""
        busy = self.running + self.health_running
        if self.mode == "prefill":
            busy += len(self.prefill_inflight)
        elif self.mode == "decode":
            busy += self.decode_transfer
        return busy == 0

    def load_snapshot(self, dp_rank):
        """srt/managers/scheduler_components/load_inquirer.py get_loads() for one DP rank (all load on rank 0)."""
        with self.lock:
            mine = dp_rank == 0
            running = (self.running + self.health_running) if mine else 0
            transfer = self.decode_transfer if (mine and self.mode == "decode") else 0
            inflight = len(self.prefill_inflight) if (mine and self.mode == "prefill") else 0
            used = self.inflight_tokens if mine else 0
            prompt = sum(v for (n, _), v in self.tok_metrics.items() if n == "prompt_tokens")
            cached = sum(self.cached_by_source.values())
        waiting = transfer          # decode: prealloc + transfer + retracted queues; prefill: + bootstrap queue
        usage = round(used / float(self.capacity_tokens), 4) if self.capacity_tokens else 0.0
        return {
            "timestamp": time.time(), "dp_rank": dp_rank, "num_running_reqs": running, "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": 0, "num_used_tokens": used, "num_total_tokens": used,
            "num_active_tokens": used, "max_total_num_tokens": self.capacity_tokens,
            "max_running_requests": self.max_running_requests, "token_usage": usage,
            "gen_throughput": 42.0 if running else 0.0, "cache_hit_rate": round(cached / prompt, 4) if prompt else 0.0,
            "utilization": 1.0 if running else 0.0, "total_prefill_uncached_tokens": max(0, prompt - cached),
            "total_prefill_busy_us": 0, "decode_moments": None,
            "memory": {"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": self.capacity_tokens},
            "speculative": None, "lora": None,
            "disaggregation": {"mode": self.mode, "prefill_bootstrap_queue_reqs": 0,
                               "prefill_inflight_queue_reqs": inflight, "decode_prealloc_queue_reqs": 0,
                               "decode_transfer_queue_reqs": transfer, "decode_retracted_queue_reqs": 0,
                               "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0},
            "queues": {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
        }

    # -- info endpoints ------------------------------------------------------------------------------------------
    def server_info(self):
        """/server_info: the real one is dataclasses.asdict(ServerArgs) + scheduler info + internal_states + version
        (http_server.py). The stub has the parsed namespace: every option of the real parser, with the values given
        or argparse's default (None where the real ServerArgs would resolve one). Paths the REAL router would try to
        load a tokenizer from are withheld unless SGLANG_STUB_REPORT_PATHS=1 (see README)."""
        info = {k: v for k, v in sorted(vars(self.ns).items())}
        info.update({
            "model_path": self.model_path, "tokenizer_path": self.tokenizer_path,
            "served_model_name": self.served_model_name, "tp_size": self.tp_size, "dp_size": self.dp_size,
            "disaggregation_mode": self.mode,
            "disaggregation_bootstrap_port": self.bootstrap_port,
            "context_length": self.context_length, "host": self.host, "port": self.port,
            "max_total_num_tokens": self.capacity_tokens, "max_req_input_len": self.context_length - 1,
            "startup_time": round(self.load_seconds, 3),
            "internal_states": [{"last_gen_throughput": 42.0, "avg_spec_accept_length": None}],
            "version": self.version, "kv_events": None, "test_double": True,
        })
        if not self.report_paths():
            for k in ("model_path", "tokenizer_path"):
                info[k] = None
        return info

    def report_paths(self):
        return env_bool(self.env, "SGLANG_STUB_REPORT_PATHS", False)

    def model_info(self):
        """/model_info field set of the version (0.5.18 adds served_model_name, load_format, reasoning_parser and
        tool_call_parser)."""
        info = {
            "model_path": self.model_path if self.report_paths() else None,
            "tokenizer_path": self.tokenizer_path if self.report_paths() else None,
            "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
            "has_image_understanding": self.is_vlm(), "has_audio_understanding": False,
            "model_type": self.model_config.get("model_type", "stub"),
            "architectures": self.model_config.get("architectures") or ["StubForCausalLM"],
        }
        if self.version != "0.5.17":
            info.update({"served_model_name": self.served_model_name,
                         "load_format": getattr(self.ns, "load_format", None) or "auto",
                         "reasoning_parser": self.reasoning_parser, "tool_call_parser": self.tool_call_parser})
        info["test_double"] = True
        return info


class PrefixCache:
    """Radix-like prefix cache of token blocks (page_size tokens each, chained hashes), a device capacity in tokens
    with LRU eviction, and with --enable-hierarchical-cache a host tier (HiCache) that keeps evicted blocks and
    loads them back on a hit. match() returns the cached prefix length in tokens; match_detail() splits it into
    (device, host) like SGLang's cached_tokens_details; insert() adds the prompt's full blocks."""

    def __init__(self, block, capacity, host_capacity=0):
        self.block = max(1, block)
        self.capacity = max(self.block, capacity)
        self.host_capacity = max(0, host_capacity)
        self.blocks = collections.OrderedDict()
        self.host = collections.OrderedDict()
        self.evicted = 0

    def _keys(self, tokens):
        keys, h = [], 0
        for i in range(0, len(tokens) - len(tokens) % self.block, self.block):
            h = hash((h, tuple(tokens[i:i + self.block])))
            keys.append(h)
        return keys

    def match_detail(self, tokens):
        dev = host = 0
        for k in self._keys(tokens):
            if k in self.blocks:
                self.blocks.move_to_end(k)
                dev += 1
            elif k in self.host:
                self.host.move_to_end(k)
                host += 1
            else:
                break
        limit = max(0, len(tokens) - 1)           # at least one token is computed
        dev_t = min(dev * self.block, limit)
        host_t = min(host * self.block, limit - dev_t)
        return dev_t, host_t

    def match(self, tokens):
        return sum(self.match_detail(tokens))

    def insert(self, tokens):
        for k in self._keys(tokens):
            self.host.pop(k, None)
            self.blocks[k] = True
            self.blocks.move_to_end(k)
        while len(self.blocks) * self.block > self.capacity:
            k, _ = self.blocks.popitem(last=False)
            self.evicted += self.block
            if self.host_capacity:
                self.host[k] = True
        while len(self.host) * self.block > self.host_capacity:
            self.host.popitem(last=False)

    def clear(self):
        self.blocks.clear()
        self.host.clear()


def bump_nic_counters(sysfs_root, devices, name, nbytes):
    """Emulated NIC: add nbytes (spread over devices) to ports/1/counters/<name>, in 4-byte units like mlx5."""
    if not devices or nbytes <= 0 or os.path.realpath(sysfs_root) == "/sys":
        return
    import fcntl
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


WRONG_ANSWER = "I cannot tell from the text given."   # the degraded answer: no overlap with any reference


def load_answer_book(path):
    """{prompt: {reference, task_type, rank, of}} from a question set (tools/quality-gate's JSON: {"items": [{id,
    task_type, prompt, reference}]}); rank orders a type's items by sha256 of the id (which ones SGLANG_STUB_DEGRADE
    makes wrong: a fixed, spread choice)."""
    if not path:
        return {}
    with open(path, encoding="utf-8") as fh:
        return answer_book_of(json.load(fh))


def answer_book_of(questions):
    """load_answer_book's map from the question set itself."""
    items = questions["items"]
    by_type = collections.defaultdict(list)
    for it in items:
        by_type[it["task_type"]].append(it)
    book = {}
    for ttype, its in by_type.items():
        its = sorted(its, key=lambda it: hashlib.sha256(str(it["id"]).encode()).hexdigest())
        for rank, it in enumerate(its):
            book[it["prompt"].strip()] = {"reference": it["reference"], "task_type": ttype, "rank": rank,
                                          "of": len(its)}
    return book


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


def thinking_enabled(parser, body):
    """serving_chat.py _get_reasoning_from_request with the parsers' reasoning_default: glm45 ("enable_thinking")
    and kimi_k3 ("thinking") think unless chat_template_kwargs sets that key to false; the stub treats every other
    parser as thinking by default."""
    if not parser:
        return False
    ctk = body.get("chat_template_kwargs") or {}
    key = {"glm45": "enable_thinking", "kimi_k3": "thinking", "kimi_k2": "thinking"}.get(parser, "enable_thinking")
    return ctk.get(key) is not False


def output_tokens(st, path, body):
    """The deterministic 'model output' as a token list [(kind, text)], kind reasoning/marker/answer.
    With a reasoning parser and thinking on (chat) the model first thinks, closes the think block, then answers;
    glm45 thinks without a leading <think> (thinks_internally), kimi_k3 starts inside the think channel
    (force_reasoning) and wraps the answer in its response channel."""
    booked = st.book_answer(prompt_of(path, body))
    answer = [("answer", w) for w in (booked or st.answer_text()).split(" ")]
    if not (path == "/v1/chat/completions" and thinking_enabled(st.reasoning_parser, body)):
        return answer
    n = st.reasoning_tokens()
    think = [("reasoning", w) for w in ("stub thinking about the question before answering " * (n // 7 + 1)).split()[:n]]
    if st.reasoning_parser == "kimi_k3":
        return think + [("marker", KIMI_K3_THINK_CLOSE), ("marker", KIMI_K3_RESPONSE_OPEN)] + answer
    return think + [("marker", "</think>")] + answer


def max_new_tokens(path, body):
    if path == "/v1/chat/completions":
        n = body.get("max_completion_tokens") or body.get("max_tokens")
    elif path == "/v1/completions":
        n = body.get("max_tokens", 16)     # OpenAI completions default
    else:
        n = (body.get("sampling_params") or {}).get("max_new_tokens")
    try:
        return int(n) if n is not None else None
    except (TypeError, ValueError):
        return None


def ignore_eos(path, body):
    if path == "/generate":
        return bool((body.get("sampling_params") or {}).get("ignore_eos"))
    return bool(body.get("ignore_eos"))


def generate(st, path, body):
    """(tokens, finish_reason): the token list cut at max_new_tokens; with ignore_eos exactly max_new_tokens (the
    answer repeated), like bench_serving's requests."""
    toks = output_tokens(st, path, body)
    n = max_new_tokens(path, body)
    if n is not None and ignore_eos(path, body) and toks:
        ans = [t for t in toks if t[0] == "answer"]
        while len(toks) < n:
            toks = toks + ans
        return toks[:n], {"type": "length", "length": n}
    if n is not None and len(toks) > n:
        return toks[:n], {"type": "length", "length": n}
    return toks, {"type": "stop", "matched": None}


def raw_text(tokens):
    out = ""
    prev = None
    for kind, text in tokens:
        if kind == "marker" or prev == "marker" or not out:
            out += text
        else:
            out += " " + text
        prev = kind
    return out


def split_reasoning(tokens):
    """(reasoning_text, content) like ReasoningParser.parse_non_stream with force_reasoning: everything before the
    close marker is reasoning; content is what follows (kimi_k3's response wrapper stripped)."""
    reasoning = [t for k, t in tokens if k == "reasoning"]
    answer = [t for k, t in tokens if k == "answer"]
    return (" ".join(reasoning) or None), " ".join(answer)


def error_body(path, message, code, err_type="BadRequestError"):
    if path.startswith("/v1/"):     # serving_base.py create_error_response (OpenAI ErrorResponse)
        return {"object": "error", "message": message, "type": err_type, "param": None, "code": code}
    return {"error": {"message": message}}   # http_server.py _create_error_response


def list_children(pid):
    """Descendants of pid from /proc (psutil.Process.children(recursive=True) without psutil)."""
    parents = collections.defaultdict(list)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry, encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        parents[ppid].append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_process_tree():
    """srt/utils/common.py kill_process_tree(os.getpid()): SIGKILL every descendant, then this process itself
    (`itself.kill()`): the server never exits 0 this way, systemd sees status=9/KILL."""
    log("INFO", "kill_process_tree called: parent_pid=%d, include_parent=True, pid=%d" % (os.getpid(), os.getpid()))
    for child in list_children(os.getpid()):
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(5)       # not reached
    os._exit(137)


# ---------------------------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------------------------

INFERENCE_PATHS = ("/generate", "/v1/chat/completions", "/v1/completions")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "sglang-stub"
    state = None  # set per server class

    # quieter, uvicorn-like access log
    def log_message(self, fmt, *args):
        log("INFO", "%s:%s - %s" % (self.client_address[0], self.client_address[1], fmt % args))

    def handle_one_request(self):
        """BaseHTTPRequestHandler.handle_one_request with uvicorn's keep-alive rule: after a response, an idle
        connection is closed when no new request starts within timeout_keep_alive (SGLANG_TIMEOUT_KEEP_ALIVE, 5 s,
        not scaled)."""
        served = getattr(self, "_served", 0)
        try:
            self.connection.settimeout(self.state.keep_alive if served else None)
            self.raw_requestline = self.rfile.readline(65537)
            self.connection.settimeout(None)
        except (TimeoutError, socket.timeout):
            self.close_connection = True
            return
        except OSError:
            self.close_connection = True
            return
        self._served = served + 1
        if len(self.raw_requestline) > 65536:
            self.requestline = self.request_version = self.command = ""
            self.send_error(414)
            return
        if not self.raw_requestline:
            self.close_connection = True
            return
        if not self.parse_request():
            return
        mname = "do_" + self.command
        if not hasattr(self, mname):
            self.send_error(501, "Unsupported method (%r)" % self.command)
            return
        getattr(self, mname)()
        try:
            self.wfile.flush()
        except OSError:
            self.close_connection = True

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
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return code

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
        """srt/utils/auth.py: /health*, /metrics exempt; everything else needs the key when one is set."""
        key = self.state.api_key
        if not key or path.startswith("/health") or path.startswith("/metrics") or path.startswith("/stub/"):
            return True
        return self.headers.get("Authorization", "") == "Bearer %s" % key

    def _chunk(self, data):
        if isinstance(data, str):
            data = data.encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _query(self):
        return dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))

    # -- dispatch ------------------------------------------------------------------------------------------------
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def _dispatch(self, method):
        st = self.state
        path = self.path.split("?", 1)[0]
        raw = self._read_body() if method in ("POST", "PUT") else b""
        with st.lock:
            st.inflight += 1
            st.counters["http_requests"] += 1
        try:
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
        if path in ("/health", "/health_generate"):
            return self._health(path)
        if path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":
                log("WARNING", "Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                               "Please use '/server_info' instead.")
            return self._send(200, st.server_info())
        if path in ("/model_info", "/get_model_info"):
            if path == "/get_model_info":
                log("WARNING", "Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                               "Please use '/model_info' instead.")
            return self._send(200, st.model_info())
        if path == "/v1/models":
            return self._send(200, {"object": "list", "data": [{
                "id": st.served_model_name, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                "root": st.served_model_name, "max_model_len": st.context_length}]})
        if path == "/get_load":
            return self._get_load()
        if path == "/v1/loads":
            return self._v1_loads()
        if path == "/metrics":
            if not st.enable_metrics:
                return self._send(404, {"detail": "Not Found"})
            return self._send(200, self._metrics(), ctype="text/plain; version=0.0.4; charset=utf-8")
        if path == "/flush_cache":
            if method not in ("GET", "POST"):
                return self._send(405, {"detail": "Method Not Allowed"})
            return self._flush_cache()
        if path == "/stub/last_requests":
            with st.lock:
                return self._send(200, {"instance": st.instance, "mode": st.mode, "version": st.version,
                                        "last_bootstrap": st.last_bootstrap, "requests": list(st.requests)})
        if path == "/stub/state":
            with st.lock:
                data = {"instance": st.instance, "mode": st.mode, "version": st.version, "loaded": st.loaded(),
                        "server_status": st.server_status, "healthy": st.healthy(),
                        "gracefully_exit": st.gracefully_exit, "draining": st.gracefully_exit,
                        "inflight": st.inflight - 1, "running": st.running, "health_running": st.health_running,
                        "prefill_inflight": len(st.prefill_inflight), "decode_transfer": st.decode_transfer,
                        "rids": sorted(st.rid_to_state), "counters": dict(st.counters),
                        "time_scale": st.time_scale,
                        "scheduler_pid": st.scheduler_proc.pid if st.scheduler_proc else None}
            data.update({"faults": sorted(st.faults()), "latency_ms": st.latency_s() * 1000.0, "pid": os.getpid()})
            return self._send(200, data)
        if path == "/stub/reset" and method == "POST":
            with st.lock:
                st.requests.clear()
                st.last_bootstrap = None
                st.counters.clear()
            return self._send(200, {"status": "reset"})
        if path in INFERENCE_PATHS:
            if method not in ("POST", "PUT") or (method == "PUT" and path != "/generate"):
                return self._send(405, {"detail": "Method Not Allowed"})
            return self._inference(path, raw)
        return self._send(404, {"detail": "Not Found"})

    # -- /health (http_server.py health_generate) ---------------------------------------------------------------
    def _health(self, path):
        st = self.state
        if st.gracefully_exit:
            log("INFO", "Health check request received during shutdown. Returning 503.")
            return self._send(503, b"")
        if st.server_status == "Starting" or "unhealthy" in st.faults():
            return self._send(503, b"")
        if not st.health_generation and path == "/health":
            return self._send(200, b"")
        tic = time.monotonic()
        rid = "%s_%s" % (HEALTH_CHECK_RID_PREFIX, uuid.uuid4().hex)
        with st.lock:
            st.rid_to_state[rid] = {"path": path, "health": True, "t0": tic}
        threading.Thread(target=self._health_generation, args=(rid,), daemon=True).start()
        deadline = tic + st.real(st.health_check_timeout)
        try:
            while time.monotonic() < deadline:
                time.sleep(st.real(1))
                with st.lock:
                    got = st.last_output > tic
                if got:
                    with st.lock:
                        st.server_status = "Up"
                    return self._send(200, b"")
            log("ERROR", "Health check failed. Server couldn't get a response from detokenizer for last %d seconds. "
                         "tic start time: %s. last_heartbeat time: %s" % (
                             st.health_check_timeout, time.strftime("%H:%M:%S", time.localtime(time.time())),
                             time.strftime("%H:%M:%S", time.localtime(time.time() - (time.monotonic() - st.last_output)))))
            with st.lock:
                st.server_status = "UnHealthy"
            return self._send(503, b"")
        finally:
            with st.lock:
                st.rid_to_state.pop(rid, None)

    def _health_generation(self, rid):
        """The 1-token generation (input_ids=[0], log_metrics=False; PD: bootstrap_host 2.2.2.2). A busy scheduler
        skips it and signals at once (HealthCheckOutput, scheduler.py); an idle one runs it; a stalled one
        (fault `hang`) never answers."""
        st = self.state
        deadline = time.monotonic() + st.hang_max_seconds
        while "hang" in st.faults() and time.monotonic() < deadline:
            time.sleep(0.05)
        if "hang" in st.faults():
            return
        with st.lock:
            busy = st.running > 0
            if not busy:
                st.health_running += 1
        if not busy:
            time.sleep(st.health_forward_s())
            with st.lock:
                st.health_running -= 1
                st.idle_cv.notify_all()
        st.output()
        del rid

    # -- loads ----------------------------------------------------------------------------------------------------
    def _get_load(self):
        log("WARNING", "Endpoint '/get_load' is deprecated and will be removed in a future version. "
                       "Please use '/v1/loads' instead.")
        ts = time.perf_counter()
        out = []
        for r in range(self.state.dp_size):
            snap = self.state.load_snapshot(r)
            out.append({"dp_rank": r, "num_reqs": snap["num_running_reqs"] + snap["num_waiting_reqs"],
                        "num_waiting_reqs": snap["num_waiting_reqs"], "num_tokens": snap["num_total_tokens"],
                        "num_pending_tokens": snap["num_total_tokens"] - snap["num_used_tokens"], "ts_tic": ts})
        return self._send(200, out)

    def _v1_loads(self):
        """srt/entrypoints/v1_loads.py + load_snapshot.py LoadSnapshot.to_dict(include)."""
        st = self.state
        q = self._query()
        include = [s.strip() for s in q["include"].split(",")] if q.get("include") else None
        valid = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}
        inc = set(include) if include else None
        if inc is not None and not inc <= valid:
            # to_dict raises ValueError outside the endpoint's try: FastAPI answers 500
            return self._send(500, "Internal Server Error", ctype="text/plain; charset=utf-8")
        ranks = range(st.dp_size)
        if q.get("dp_rank") not in (None, ""):
            r = int(q["dp_rank"])
            ranks = [r] if 0 <= r < st.dp_size else []
        loads = []
        for r in ranks:
            snap = st.load_snapshot(r)
            core = {k: v for k, v in snap.items() if k not in ("memory", "speculative", "lora", "disaggregation",
                                                               "queues")}
            if inc is None or "all" in inc:
                inc_all = True
            elif inc == {"core"}:
                loads.append(core)
                continue
            else:
                inc_all = False
            for field, name in (("memory", "memory"), ("speculative", "spec"), ("lora", "lora"),
                                ("disaggregation", "disagg"), ("queues", "queues")):
                if snap[field] is None or (not inc_all and name not in inc):
                    continue
                core[field] = snap[field]
            loads.append(core)
        if q.get("format") == "prometheus":
            prefixes = {"speculative": "spec", "disaggregation": "disagg"}
            samples = collections.OrderedDict()
            for load in loads:
                load = dict(load)
                dp = load.pop("dp_rank")
                for key, value in load.items():
                    if isinstance(value, dict):
                        for sk, sv in value.items():
                            if isinstance(sv, (int, float)) and not isinstance(sv, bool):
                                samples.setdefault("sglang_%s_%s" % (prefixes.get(key, key), sk), []).append((dp, sv))
                    elif isinstance(value, (int, float)) and not isinstance(value, bool):
                        samples.setdefault("sglang_%s" % key, []).append((dp, value))
            lines = []
            for name, vals in samples.items():
                lines.append("# TYPE %s gauge" % name)
                lines += ['%s{dp_rank="%s"} %s' % (name, dp, v) for dp, v in vals]
            return self._send(200, "\n".join(lines) + "\n", ctype="text/plain; version=0.0.4; charset=utf-8")
        return self._send(200, {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()),
                                "version": st.version, "accelerator": "NVIDIA B300 SXM6 AC",
                                "num_accelerators": st.tp_size * st.pp_size, "loads": loads})

    # -- /flush_cache (http_server.py + scheduler_components/flush_wrapper.py) ---------------------------------
    def _flush_cache(self):
        st = self.state
        try:
            timeout = float(self._query().get("timeout", 0.0))
        except ValueError:
            return self._send(422, {"detail": "timeout must be a number"})
        if timeout < 0:
            return self._send(422, {"detail": "timeout must be >= 0"})
        with st.lock:
            if st.flush_pending:
                return self._send(400, "Another flush_cache is already in progress.", ctype="text/plain")
            if timeout > 0 and not st.is_fully_idle():
                st.flush_pending = True
                deadline = time.monotonic() + timeout
                while not st.is_fully_idle() and time.monotonic() < deadline:
                    st.idle_cv.wait(min(0.05, max(0.0, deadline - time.monotonic())))
                st.flush_pending = False
                if not st.is_fully_idle():
                    log("WARNING", "Deferred flush_cache timed out while waiting for idle state.")
                    return self._send(400, "Timed out waiting for idle state.", ctype="text/plain")
            if not st.is_fully_idle():
                log("WARNING", "Cache not flushed because there are pending requests. #queue-req: %d, "
                               "#running-req: %d" % (st.decode_transfer + len(st.prefill_inflight),
                                                     st.running + st.health_running))
                return self._send(400, "Flush cache failed.\n", ctype="text/plain")
            st.prefix_cache.clear()
            log("INFO", "Cache flushed successfully!")
        return self._send(200, FLUSH_OK_TEXT, ctype="text/plain")

    # -- inference -----------------------------------------------------------------------------------------------
    def _inference(self, path, raw):
        st = self.state
        t0 = time.monotonic()
        try:
            body = json.loads(raw or b"{}")
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
        except ValueError as exc:
            # http_server.py validation_exception_handler: 400 (not FastAPI's 422)
            return self._send(400, error_body(path, "invalid JSON body: %s" % exc, 400))
        rid = body.get("rid") or uuid.uuid4().hex
        stream = bool(body.get("stream"))
        # warm-up / health requests (bootstrap_host 2.2.2.2) and --disaggregation-transfer-backend fake move no KV
        fake_host = body.get("bootstrap_host") == FAKE_BOOTSTRAP_HOST     # skip_radix_cache_insert as well
        fake = fake_host or st.transfer_backend == "fake"
        entry = {"time": time.time(), "path": path, "rid": rid, "stream": stream,
                 "model": body.get("model"), "bootstrap_room": body.get("bootstrap_room"),
                 "bootstrap_host": body.get("bootstrap_host"), "bootstrap_port": body.get("bootstrap_port"),
                 "x_request_id": self.headers.get("X-Request-Id"), "mode": st.mode}
        if st.mode != "null" and body.get("bootstrap_room") is None and st.transfer_backend != "fake":
            # scheduler.py: a PD worker refuses a request without bootstrap_room (prepare_abort, 400)
            msg = ("Invalid request: Disaggregated request received without bootstrap room id. req.rid=%r" % rid)
            log("ERROR", msg)
            entry["status"] = 400
            st.record(entry)
            if stream and path == "/generate":
                return self._stream_error(msg, 400)
            return self._send(400, error_body(path, msg, 400))
        flags = {"running": True}
        with st.lock:
            st.rid_to_state[rid] = {"path": path, "health": False, "t0": t0}
            st.running += 1
        try:
            return self._run(path, body, rid, stream, (fake, fake_host), entry, t0, flags)
        finally:
            self._leave_running(flags)
            with st.lock:
                st.rid_to_state.pop(rid, None)

    def _leave_running(self, flags):
        """The request leaves the scheduler's running batch / waiting queue."""
        st = self.state
        with st.lock:
            if flags["running"]:
                st.running -= 1
                flags["running"] = False
                st.idle_cv.notify_all()

    def _run(self, path, body, rid, stream, fakes, entry, t0, flags):
        st = self.state
        fake, fake_host = fakes
        faults = st.faults()
        if "hang" in faults:            # a stalled scheduler: nothing comes out until the fault is cleared
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
        if not st.first_forward_done:
            # the first forward pass after start (cold JIT, graph warm-up): SGLANG_STUB_WARMUP_SECONDS real seconds
            time.sleep(st.real(st.warmup_seconds()))
            st.first_forward_done = True

        prompt = prompt_of(path, body)
        p_tokens = count_tokens(prompt)
        toks = str(prompt).split() or [""]
        with st.lock:
            # decode has no radix cache (SGLang PD): its cached_tokens is the prefill's, carried with the KV
            dev, host = (0, 0) if st.mode == "decode" else st.prefix_cache.match_detail(toks)
            st.inflight_tokens += p_tokens
        try:
            if st.mode == "prefill":
                time.sleep(st.latency_s() / 2)   # the prefill computes, then the blocks enter the cache
                with st.lock:
                    if not fake_host:
                        st.prefix_cache.insert(toks)
                    st.realtime["prefill_compute"] += p_tokens - dev - host
                    st.realtime["prefill_cache"] += dev + host
                st.output()
                self._leave_running(flags)
                if not fake:
                    ok = self._prefill_wait_transfer(body, dev, host, p_tokens, t0)
                    if not ok:
                        # handle_bootstrap_failure -> prepare_abort(..., INTERNAL_SERVER_ERROR) (prefill.py 17:971-996)
                        entry["status"] = 500
                        st.record(entry)
                        return self._send(500, error_body(
                            path, "Prefill bootstrap failed for request bootstrap_room=%s: timed out after %.1fs in "
                            "KVPoll.Bootstrapping (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)"
                            % (body.get("bootstrap_room"), time.monotonic() - t0), 500, "InternalServerError"))
            elif st.mode == "decode":
                if not fake:
                    with st.lock:
                        st.decode_transfer += 1
                    try:
                        dev, host = self._pull_kv(body, p_tokens)
                    except (RuntimeError, OSError, ValueError) as exc:
                        log("ERROR", "Decode transfer failed: %s" % exc)
                        with st.lock:
                            st.counters["kv_transfer_failed"] += 1
                        entry["status"] = 500
                        st.record(entry)
                        return self._send(500, error_body(path, "KVTransferError: %s" % exc, 500,
                                                          "InternalServerError"))
                    finally:
                        with st.lock:
                            st.decode_transfer -= 1
                            st.idle_cv.notify_all()
            else:
                with st.lock:
                    st.prefix_cache.insert(toks)
                    st.realtime["prefill_compute"] += p_tokens - dev - host
                    st.realtime["prefill_cache"] += dev + host
            cached = dev + host
            if st.mode == "prefill":      # FINISH_LENGTH(length=0): the prefill's answer carries no text
                tokens, finish = [], {"type": "length", "length": 0}
            else:
                tokens, finish = generate(st, path, body)
            c_tokens = len(tokens)
            usage = {"prompt_tokens": p_tokens, "completion_tokens": c_tokens, "total_tokens": p_tokens + c_tokens}
            details = {"device": dev, "host": host}
            latency = st.latency_s() if st.mode != "prefill" else 0.0
            with (st.batch_slot() if st.mode != "prefill" else contextlib.nullcontext()):
                if st.mode != "prefill":
                    time.sleep(st.prefill_s(p_tokens - cached))   # step model: the prefill forward (else 0)
                if stream:
                    status = self._stream(path, body, rid, tokens, usage, latency, cached, details, finish)
                else:
                    time.sleep(latency)
                    for _ in tokens[1:]:             # step model: one step per token after the first (else 0)
                        time.sleep(st.step_s())
                    status = self._send(200, self._full_response(path, body, rid, tokens, usage, t0, cached,
                                                                 details, finish))
            st.output()
            entry["status"] = status
            entry["cached_tokens"] = cached
            st.record(entry)
            with st.lock:
                st.counters["requests_ok"] += 1
                key = "true" if stream else "false"
                for name, val in (("prompt_tokens", p_tokens), ("generation_tokens", c_tokens), ("requests", 1)):
                    st.tok_metrics[(name, key)] = st.tok_metrics.get((name, key), 0) + val
                if cached > 0:   # observe_one_finished_request: the scheduler always sends the details on a hit
                    for source, val in (("device", dev), ("host", host)):
                        if val > 0:
                            st.cached_by_source[source] += val
                if st.mode != "prefill":
                    st.realtime["decode"] += c_tokens
                st.e2e.setdefault(key, []).append(time.monotonic() - t0)
                del st.e2e[key][:-1000]
            return None
        finally:
            with st.lock:
                st.inflight_tokens -= p_tokens

    def _prefill_wait_transfer(self, body, dev, host, p_tokens, t0):
        """The prefill keeps the request in its inflight queue after the forward until the decode has pulled the KV
        (prefill.py process_disagg_prefill_inflight_queue), then answers. A decode that never comes (dead before the
        handshake: it never sends the KV indices) leaves the request in KVPoll.Bootstrapping until
        SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT (scaled) after the request arrived (conn.py 17:1203-1217), when it
        fails (the decode's pull stands for the handshake and the transfer together)."""
        st = self.state
        room = str(body.get("bootstrap_room"))
        ev = threading.Event()
        with st.lock:
            st.prefill_inflight[room] = {"event": ev, "device": dev, "host": host, "prompt_tokens": p_tokens,
                                         "time": time.monotonic()}
        ok = ev.wait(max(0.0, st.real(st.bootstrap_timeout) - (time.monotonic() - t0)))
        with st.lock:
            st.prefill_inflight.pop(room, None)
            if not ok:
                st.counters["kv_transfer_failed"] += 1
            st.idle_cv.notify_all()
        return ok

    def _stream_error(self, message, code):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk("data: %s\n\n" % json.dumps({"text": "", "meta_info": {
            "finish_reason": {"type": "abort", "message": message, "status_code": code}}}))
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return 200

    def _pull_kv(self, body, p_tokens):
        """Decode side of the PD hand-off: wait for the prefill's KV of this bootstrap_room and pull it. Over RDMA
        the bytes appear on the NIC counters of both sides' --disaggregation-ib-device; over TCP they do not.
        Returns the prefill's (device, host) hit, which the decode reports (decode.py)."""
        st = self.state
        host, port, room = body.get("bootstrap_host"), body.get("bootstrap_port"), body.get("bootstrap_room")
        if not host or room is None:
            return 0, 0
        transport = st.transport()
        url = "http://%s:%s/stub/kv?room=%s&transport=%s&devices=%s" % (
            "[%s]" % host if ":" in str(host) else host, port or 8998, room, transport, ",".join(st.ib_devices))
        deadline = time.monotonic() + max(st.real(st.waiting_timeout), 60.0)
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=max(10.0, 2 * st.kv_transfer_s() + 5)) as resp:
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
            return int(info.get("device", 0)), int(info.get("host", 0))
        raise RuntimeError("Failed to get kvcache from prefill instance, it might be dead (stub: room %s)" % room)

    def _chat_message(self, body, tokens):
        st = self.state
        if st.reasoning_parser and body.get("separate_reasoning", True) and thinking_enabled(st.reasoning_parser,
                                                                                             body):
            reasoning, content = split_reasoning(tokens)
            return {"role": "assistant", "content": content or "", "reasoning_content": reasoning or None,
                    "tool_calls": None}
        return {"role": "assistant", "content": raw_text(tokens), "reasoning_content": None, "tool_calls": None}

    def _usage(self, usage, cached, tokens):
        out = dict(usage)
        out["prompt_tokens_details"] = {"cached_tokens": cached} if self.state.enable_cache_report else None
        out["reasoning_tokens"] = sum(1 for k, _ in tokens if k == "reasoning")
        return out

    def _full_response(self, path, body, rid, tokens, usage, t0, cached, details, finish):
        st = self.state
        now = int(time.time())
        model = body.get("model") or "default"
        if path == "/v1/chat/completions":
            return {"id": rid, "object": "chat.completion", "created": now, "model": model,
                    "choices": [{"index": 0, "message": self._chat_message(body, tokens),
                                 "logprobs": None, "finish_reason": finish["type"],
                                 "matched_stop": finish.get("matched")}],
                    "usage": self._usage(usage, cached, tokens)}
        if path == "/v1/completions":
            return {"id": rid, "object": "text_completion", "created": now, "model": model,
                    "choices": [{"index": 0, "text": raw_text(tokens), "logprobs": None,
                                 "finish_reason": finish["type"], "matched_stop": finish.get("matched")}],
                    "usage": self._usage(usage, cached, tokens)}
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": usage["prompt_tokens"],
                "completion_tokens": usage["completion_tokens"], "cached_tokens": cached,
                "e2e_latency": round(time.monotonic() - t0, 4)}
        if cached > 0:
            meta["cached_tokens_details"] = details
        del st
        return {"text": raw_text(tokens), "output_ids": list(range(len(tokens))), "meta_info": meta}

    def _stream(self, path, body, rid, tokens, usage, latency, cached, details, finish):
        st = self.state
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        now = int(time.time())
        steps = max(1, len(tokens))
        model = body.get("model") or "default"
        split = (path == "/v1/chat/completions" and st.reasoning_parser and body.get("separate_reasoning", True)
                 and thinking_enabled(st.reasoning_parser, body))

        def event(obj):
            self._chunk("data: %s\n\n" % json.dumps(obj))

        base = {"id": rid, "object": "chat.completion.chunk", "created": now, "model": model}
        if path == "/v1/chat/completions":
            event(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                       "logprobs": None, "finish_reason": None}]))
        sent = []
        prev_kind = None
        for i, (kind, text) in enumerate(tokens):
            time.sleep(latency / steps + (st.step_s() if i else 0.0))   # the first token came out of the prefill
            st.output()
            piece = text if (i == 0 or kind == "marker" or prev_kind == "marker") else " " + text
            if split and prev_kind == "marker" and kind == "answer":
                piece = text
            prev_kind = kind
            sent.append(piece)
            if path == "/v1/chat/completions":
                if split and kind == "marker":
                    continue
                delta = {"reasoning_content": piece} if (split and kind == "reasoning") else {"content": piece}
                event(dict(base, choices=[{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}]))
            elif path == "/v1/completions":
                event({"id": rid, "object": "text_completion", "created": now, "model": model,
                       "choices": [{"index": 0, "text": piece, "logprobs": None, "finish_reason": None}]})
            else:
                event({"text": "".join(sent), "meta_info": {"id": rid, "finish_reason": None,
                                                             "prompt_tokens": usage["prompt_tokens"],
                                                             "completion_tokens": i + 1, "cached_tokens": cached}})
        if not tokens:
            time.sleep(latency)
        if path == "/v1/chat/completions":
            event(dict(base, choices=[{"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish["type"],
                                       "matched_stop": finish.get("matched")}]))
            if (body.get("stream_options") or {}).get("include_usage"):
                event(dict(base, choices=[], usage=self._usage(usage, cached, tokens)))
        elif path == "/v1/completions":
            event({"id": rid, "object": "text_completion", "created": now, "model": model,
                   "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": finish["type"]}]})
        else:
            meta = {"id": rid, "finish_reason": finish, "prompt_tokens": usage["prompt_tokens"],
                    "completion_tokens": len(tokens), "cached_tokens": cached}
            if cached > 0:
                meta["cached_tokens_details"] = details
            event({"text": "".join(sent), "meta_info": meta})
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return 200

    # -- /metrics ------------------------------------------------------------------------------------------------
    def _metrics(self):
        """Prometheus text like SGLang's multiprocess collector (srt/observability/metrics_collector.py): tokenizer
        counters labelled model_name, engine_type (+ is_streaming / cache_source), scheduler metrics labelled
        model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (rank 0 only, kv_transfer_total_mb per sending rank);
        labels sorted, values as floats, a series only after its first observation (0.5.18 pre-seeds
        prefill_effective_tokens_total). Names, types, label sets and HELP texts are checked against exposition text
        written by the REAL collector (contract/metrics-*.txt)."""
        st = self.state
        with st.lock:
            tok = dict(st.tok_metrics)
            cached = dict(st.cached_by_source)
            e2e = {k: list(v) for k, v in st.e2e.items()}
            realtime = dict(st.realtime)
            kv_mb = list(st.kv_mb)
            running = st.running + st.health_running
            used = st.inflight_tokens
            inflight = len(st.prefill_inflight)
            transfer = st.decode_transfer
            logged = st.first_forward_done
        out = ["# TEST DOUBLE: sglang-stub %s (%s) - these figures are synthetic" % (st.version, st.instance)]

        def lab(pairs):
            return "{" + ",".join('%s="%s"' % (k, v) for k, v in sorted(pairs.items())) + "}"

        def num(v):
            return repr(float(v))

        tl = {"model_name": st.served_model_name, "engine_type": st.engine_type}
        sl = dict(tl, tp_rank="0", pp_rank="0", moe_ep_rank="0")

        def family(name, mtype, help_, samples):
            if not samples:
                return
            out.extend(["# HELP sglang:%s %s" % (name, help_), "# TYPE sglang:%s %s" % (name, mtype)])
            out.extend("sglang:%s%s %s" % (n, lab(labels), num(v)) for n, labels, v in samples)

        def histogram(name, help_, buckets, series):
            samples = []
            for labels, values in series:
                samples.append((name + "_sum", labels, sum(values)))
                for b in buckets:
                    samples.append((name + "_bucket", dict(labels, le=repr(float(b))), sum(1 for x in values if x <= b)))
                samples.append((name + "_bucket", dict(labels, le="+Inf"), len(values)))
                samples.append((name + "_count", labels, len(values)))
            family(name, "histogram", help_, samples)

        def streaming(key, name):
            return [(name, dict(tl, is_streaming=k), v) for (n, k), v in sorted(tok.items()) if n == key]

        family("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
               streaming("prompt_tokens", "prompt_tokens_total"))
        family("generation_tokens_total", "counter", "Number of generation tokens processed.",
               streaming("generation_tokens", "generation_tokens_total"))
        family("cached_tokens_total", "counter", "Number of cached prompt tokens by source (device/host/storage).",
               [("cached_tokens_total", dict(tl, cache_source=s), v) for s, v in sorted(cached.items()) if v > 0])
        family("num_requests_total", "counter", "Number of requests processed.",
               streaming("requests", "num_requests_total"))
        histogram("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
                  [0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0, 80.0, 100.0, 200.0,
                   400.0, 600.0, 1200.0, 1800.0, 2400.0],
                  [(dict(tl, is_streaming=k), v) for k, v in sorted(e2e.items())])
        aborted = st.counters.get("generation_errors", 0)
        family("num_aborted_requests_total", "counter", "Number of requests aborted.",
               [("num_aborted_requests_total", tl, aborted)] if aborted else [])
        if logged:   # the scheduler's log_stats has run (first batch): its gauges exist
            for name, help_, value in (
                    ("num_running_reqs", "The number of running requests.", running),
                    ("num_queue_reqs", "The number of requests in the waiting queue.", transfer),
                    ("gen_throughput", "The generation throughput (token/s).", 42.0 if running else 0.0),
                    ("cache_hit_rate", "The prefix cache hit rate.",
                     round(sum(cached.values()) / float(max(1, sum(v for (n, _), v in tok.items() if n == "prompt_tokens"))), 6)),
                    ("token_usage", "The token usage.", round(used / float(st.capacity_tokens), 6)),
                    ("num_used_tokens", "The number of used tokens.", used),
                    ("num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.", 0),
                    ("num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.",
                     inflight),
                    ("num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.", 0),
                    ("num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.",
                     transfer)):
                family(name, "gauge", help_, [(name, sl, value)])
        family("realtime_tokens_total", "counter",
               "Total number of tokens processed (updated on each log interval). mode: prefill_compute, "
               "prefill_cache, decode.",
               [("realtime_tokens_total", dict(sl, mode=m), realtime[m])
                for m in ("prefill_compute", "prefill_cache", "decode") if realtime.get(m, 0) > 0])
        if st.version != "0.5.17":
            hits = realtime.get("prefill_cache", 0)
            dev = cached.get("device", 0) if st.mode != "decode" else 0
            host = cached.get("host", 0) if st.mode != "decode" else 0
            family("prefill_effective_tokens_total", "counter",
                   "Effective prefill tokens with retracted-request re-counts excluded, updated on each log interval. "
                   "mode: device_hit, host_hit, storage_hit, input. Windowed prefix cache hit rate = rate(sum of *_hit) "
                   "/ rate(sum of all modes); per-tier rate uses a single *_hit mode in the numerator.",
                   [("prefill_effective_tokens_total", dict(sl, mode=m), v) for m, v in (
                       ("input", realtime.get("prefill_compute", 0)), ("device_hit", min(dev, hits)),
                       ("host_hit", min(host, max(0, hits - dev))), ("storage_hit", 0))])
        if st.mode == "prefill" and kv_mb:
            ranks = max(1, st.tp_size)
            histogram("kv_transfer_total_mb", "Histogram of KV cache transfer size in MB.",
                      [1, 5, 10, 50, 100, 500, 1000, 5000, 10000],
                      [(dict(sl, tp_rank=str(r)), [mb / ranks for mb in kv_mb]) for r in range(ranks)])
        failed = st.counters.get("kv_transfer_failed", 0)
        if st.mode in ("prefill", "decode") and failed:
            family("num_transfer_failed_reqs_total", "counter", "The number of transfer failed requests.",
                   [("num_transfer_failed_reqs_total", sl, failed)])
        return "\n".join(out) + "\n"



class BootstrapHandler(BaseHTTPRequestHandler):
    """The prefill bootstrap server (disaggregation/common/conn.py CommonKVBootstrapServer, aiohttp): /route
    (GET/PUT), /register_dp_rank, /query_dp_ranks, /health -> OK. The stub's own /stub/kv stands in for the ZMQ +
    Mooncake path the real KV takes (per-rank ports the sandbox never crosses)."""
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, fmt, *args):
        pass

    def _reply(self, code, body, ctype="text/plain; charset=utf-8"):
        data = body if isinstance(body, bytes) else (json.dumps(body) if isinstance(body, (dict, list)) else
                                                     str(body)).encode()
        if isinstance(body, (dict, list)):
            ctype = "application/json; charset=utf-8"
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self):
        st = self.state
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        path = self.path.split("?", 1)[0]
        q = dict(urllib.parse.parse_qsl(urllib.parse.urlparse(self.path).query))
        if path.startswith("/stub/kv"):
            return self._kv(q)
        if path == "/health" and self.command == "GET":
            return self._reply(200, "OK")
        if path == "/route":
            if self.command == "PUT":
                return self._reply(200, "OK")
            if self.command != "GET":
                return self._reply(405, "Method not allowed", "application/json")
            keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
            if not all(q.get(k) for k in keys):
                return self._reply(400, "Missing inputs for bootstrap server.")
            if all(q[k] == "-1" for k in keys):
                return self._reply(200, {"attn_tp_size": st.tp_size, "attn_cp_size": 1, "dp_size": st.dp_size,
                                         "pp_size": st.pp_size, "page_size": st.prefix_cache.block,
                                         "kv_cache_dtype": getattr(st.ns, "kv_cache_dtype", None) or "auto",
                                         "follow_bootstrap_room": True, "enable_dsa_cache_layer_split": False,
                                         "prefill_http_port": st.port})
            return self._reply(200, {"rank_ip": st.host, "rank_port": st.bootstrap_port})
        if path == "/register_dp_rank" and self.command == "POST":
            return self._reply(200, "OK")
        if path == "/query_dp_ranks" and self.command == "POST":
            try:
                rooms = json.loads(raw or b"{}").get("bootstrap_rooms") or []
            except ValueError:
                rooms = []
            return self._reply(200, {str(int(r)): 0 for r in rooms})
        return self._reply(404, "404: Not Found")

    def _kv(self, q):
        st = self.state
        with st.lock:
            info = st.prefill_inflight.get(q.get("room"))
        if info is None or info.get("taken"):
            return self._reply(404, {"error": "room not ready"})
        mine = st.transport()
        if mine != q.get("transport"):
            return self._reply(500, {"error": "NotSupportedTransport: prefill %s, decode %s" % (mine, q.get("transport"))})
        info["taken"] = True
        time.sleep(st.kv_transfer_s())          # the transfer itself: the request stays in the inflight queue
        nbytes = info["prompt_tokens"] * st.kv_bytes_per_token
        if mine == "rdma":
            bump_nic_counters(st.sysfs_root, st.active_devices(), "port_xmit_data", nbytes)
        with st.lock:
            st.kv_mb.append(nbytes / 1048576.0)
            st.counters["kv_transfer_count"] += 1
        info["event"].set()
        return self._reply(200, {"device": info["device"], "host": info["host"], "kv_bytes": nbytes,
                                 "transport": mine})

    do_GET = do_PUT = do_POST = do_DELETE = _handle


def make_server(host, port, handler_cls):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET

    class Server(ThreadingHTTPServer):
        address_family = family
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 2048            # uvicorn's default backlog

    return Server((host, port), handler_cls)


def banner(st, argv):
    lines = [
        "=" * 78,
        "  THIS IS A TEST DOUBLE (sglang-stub), NOT SGLang. No model is loaded, no GPU is used.",
        "  emulating: sglang %s serve   instance: %s   mode: %s   time scale: %s" % (
            st.version, st.instance, st.mode, st.time_scale),
        "  served_model_name=%s tp_size=%d dp_size=%d bootstrap_port=%s" % (
            st.served_model_name, st.tp_size, st.dp_size, st.bootstrap_port if st.mode == "prefill" else "-"),
        "  control dir: %s (files: fault, latency_ms, kv_transfer_ms, warmup_seconds)   pid %d" % (
            st.control_dir, os.getpid()),
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


SCHEDULER_ARG = "__sglang_stub_scheduler__"


def scheduler_child():
    """The emulated scheduler process (srt/managers/scheduler.py run_scheduler_process): dies with its parent
    (kill_itself_when_parent_died: PR_SET_PDEATHSIG SIGKILL), installs NO SIGTERM handler (a SIGTERM kills it at once,
    as KillMode=control-group sends one to every process of the unit), exits 0 on the parent's shutdown request
    (ShutdownReq) or when the parent's end of the pipe closes."""
    try:
        import ctypes
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        for line in sys.stdin:
            if line.strip() == "shutdown":
                break
    except (OSError, KeyboardInterrupt):
        return 1
    return 0


def start_scheduler():
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), SCHEDULER_ARG], stdin=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, close_fds=True, text=True, start_new_session=False)


class SubprocessWatchdog(threading.Thread):
    """srt/utils/watchdog.py SubprocessWatchdog: polls the child every interval (1 s, scaled); a child that exited
    with a non-zero code (a signal included) -> log and SIGQUIT to this process, whose handler kills the tree."""

    def __init__(self, st):
        super().__init__(name="subprocess-watchdog", daemon=True)
        self.st = st
        self.stopped = threading.Event()

    def run(self):
        proc = self.st.scheduler_proc
        while not self.stopped.wait(self.st.real(1.0)):
            rc = proc.poll()
            if rc is None or rc == 0:
                continue
            log("ERROR", "Subprocess scheduler_0 (pid=%d) crashed with exit code %d. Triggering SIGQUIT for cleanup..."
                % (proc.pid, rc))
            os.kill(os.getpid(), signal.SIGQUIT)
            return


def sigterm_watchdog(st, watchdog):
    """tokenizer_manager.py sigterm_watchdog: wakes every 5 s (scaled); after SIGTERM drains (every request in
    rid_to_state, /health generations included, 5 s steps; UnHealthy -> force exit), then stops the subprocess
    watchdog, sends ShutdownReq to the scheduler, waits up to 15 s (scaled) and kill_process_tree(include_parent)."""
    while not st.gracefully_exit:
        time.sleep(st.real(5))
    while True:
        with st.lock:
            remaining = sorted(st.rid_to_state)
            status = st.server_status
        if status == "UnHealthy":
            log("ERROR", "Signal SIGTERM received while health check failed. Force exiting.")
            break
        if env_bool(st.env, "SGL_FORCE_SHUTDOWN", False):
            log("ERROR", "Signal SIGTERM received while force shutdown flag set. Force exiting.")
            break
        log("INFO", "Gracefully exiting... Remaining number of requests %d. Remaining requests remaining_rids=%r."
            % (len(remaining), remaining))
        if remaining:
            time.sleep(st.real(5))
        else:
            break
    watchdog.stopped.set()
    proc = st.scheduler_proc
    try:
        proc.stdin.write("shutdown\n")
        proc.stdin.flush()
    except (OSError, ValueError):
        pass
    deadline = time.monotonic() + st.real(15)
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    kill_process_tree()


def warmup(st):
    """http_server.py _execute_server_warmup / _wait_and_warmup: poll /model_info (1 s x 120), then one warm-up
    request with timeout SGLANG_WARMUP_TIMEOUT (-1: 600 s, PD 1800 s; scaled): /generate "The capital city of France
    is" (a VLM: a chat completion with an image), PD: /generate per DP rank with bootstrap_host 2.2.2.2. Failure or
    timeout: "Initialization failed" and kill_process_tree (PD: a non-200 status only sets UnHealthy)."""
    host = "127.0.0.1" if st.host in ("0.0.0.0", "", "::") else st.host
    url = "http://%s:%d" % ("[%s]" % host if ":" in host else host, st.port)
    headers = {"Content-Type": "application/json"}
    if st.api_key:
        headers["Authorization"] = "Bearer %s" % st.api_key
    if st.skip_server_warmup:
        st.server_status = "Up"
        log("INFO", "The server is fired up and ready to roll!")
        return
    last = None
    for _ in range(120):
        time.sleep(st.real(1))
        try:
            with urllib.request.urlopen(urllib.request.Request(url + "/model_info", headers=headers), timeout=5) as r:
                if r.status == 200:
                    last = None
                    break
        except (OSError, ValueError) as exc:
            last = exc
    if last is not None:
        log("ERROR", "Initialization failed. warmup error: %r" % last)
        kill_process_tree()
    timeout = st.warmup_timeout if st.warmup_timeout > 0 else (600 if st.mode == "null" else 1800)
    timeout = st.real(timeout)
    try:
        if st.mode == "null":
            if st.is_vlm():
                path, body = "/v1/chat/completions", {
                    "model": st.served_model_name, "max_tokens": 8, "stream": False, "temperature": 0.0,
                    "messages": [{"role": "user", "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,(448x448 warm-up image)"}},
                        {"type": "text", "text": "Describe the image."}]}]}
            else:
                path, body = "/generate", {"text": "The capital city of France is",
                                           "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
            req = urllib.request.Request(url + path, data=json.dumps(body).encode(), headers=headers, method="POST")
            with urllib.request.urlopen(req, timeout=timeout) as r:
                r.read()
                if r.status != 200:
                    raise AssertionError(r.status)
            st.server_status = "Up"
        else:
            log("INFO", "Start of pd disaggregation warmup ...")
            codes = []
            for dp_rank in range(st.dp_size):
                body = {"sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": True},
                        "bootstrap_host": FAKE_BOOTSTRAP_HOST, "bootstrap_room": dp_rank,
                        "input_ids": [10, 11, 12, 13], "routed_dp_rank": dp_rank}
                req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), headers=headers,
                                             method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=timeout) as r:
                        r.read()
                        codes.append(r.status)
                except urllib.error.HTTPError as exc:
                    codes.append(exc.code)
            failed = [c for c in codes if c != 200]
            if not failed:
                log("INFO", "Disaggregation warmup requests completed for all %s DP ranks" % st.dp_size)
                log("INFO", "End of disaggregation warmup")
            else:
                log("INFO", "Disaggregation warmup failed (mode=%s), status codes: %s" % (st.mode, failed))
            st.server_status = "UnHealthy" if failed else "Up"
    except Exception as exc:  # like the real one: any failure ends the server
        log("ERROR", "Initialization failed. warmup error: %s: %s" % (type(exc).__name__, exc))
        kill_process_tree()
    log("INFO", "The server is fired up and ready to roll!")


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
    env = os.environ if env is None else env
    ns, warnings = parse_serve_args(version, argv)
    for w in warnings:
        log("WARNING", w)
    err = cuda_init_error(env)
    if err:
        log("ERROR", err)
        return 1
    try:
        st = StubState(ns, version, env)
    except ValueError as exc:   # an unparsable SGLANG_* variable stops the real server at start as well
        log("ERROR", "ValueError: %s" % exc)
        return 1
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

    # The launch phase: a SIGQUIT from a child (or the watchdog) kills the tree (engine.py launch_phase_sigquit_handler)
    def on_sigquit(signum, _frame):
        log("ERROR", "SIGQUIT received. signum=%d. It usually means one child failed." % signum)
        kill_process_tree()

    signal.signal(signal.SIGQUIT, on_sigquit)
    st.scheduler_proc = start_scheduler()
    servers = []
    if st.mode == "prefill":
        # the bootstrap server starts in the tokenizer manager, BEFORE the model loads; a bind error is only logged
        bh = type("BoundBootstrap", (BootstrapHandler,), {"state": st})
        try:
            boot = make_server(st.host, st.bootstrap_port, bh)
            servers.append(boot)
            threading.Thread(target=boot.serve_forever, name="bootstrap", daemon=True).start()
            log("INFO", "bootstrap server listening on %s:%d" % (st.host, st.bootstrap_port))
        except OSError as exc:
            log("ERROR", "Server error: %s (bootstrap port %s:%d)" % (exc, st.host, st.bootstrap_port))

    # Model load: the HTTP port is NOT bound until the scheduler reports ready (engine.py wait_for_ready)
    deadline = time.monotonic() + max(0.0, st.load_seconds)
    while time.monotonic() < deadline:
        if st.scheduler_proc.poll() is not None:
            log("ERROR", "Rank 0 scheduler is dead. Please check if there are relevant logs.")
            kill_process_tree()
        time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    if "die_after_load" in st.faults():
        log("ERROR", "fault die_after_load: exiting 1 as a crashed server would")
        try:
            st.scheduler_proc.kill()
        except OSError:
            pass
        os._exit(1)
    log("INFO", "Load weight end. (stub: simulated load of %.1fs)" % st.load_seconds)

    handler = type("BoundHandler", (Handler,), {"state": st})
    try:
        httpd = make_server(st.host, st.port, handler)
    except OSError as exc:
        log("ERROR", "cannot listen on %s:%d: %s" % (st.host, st.port, exc))
        st.scheduler_proc.kill()
        return 1
    servers.append(httpd)
    watchdog = SubprocessWatchdog(st)
    watchdog.start()

    def on_sigterm(signum, _frame):
        log("WARNING", "SIGTERM received. signum=%d frame=None. Draining requests and shutting down..." % signum)
        st.gracefully_exit = True

    def on_sigint(signum, _frame):
        log("INFO", "received %s: stopping (no drain)" % signal.Signals(signum).name)
        kill_process_tree()

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)
    threading.Thread(target=sigterm_watchdog, args=(st, watchdog), name="sigterm-watchdog", daemon=True).start()
    threading.Thread(target=warmup, args=(st,), name="warmup", daemon=True).start()
    log("INFO", "Uvicorn running on http://%s:%d (sglang-stub; Press CTRL+C to quit)" % (st.host, st.port))
    httpd.serve_forever(poll_interval=0.2)
    return 0


USAGE = """usage: sglang {serve,version} ...   (TEST DOUBLE sglang-stub)
  sglang serve [server args]   parse args like the real sglang %s parser, then serve the HTTP API
  sglang version               print the emulated version
"""


def main(argv=None, argv0=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == SCHEDULER_ARG:
        return scheduler_child()
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
