#!/usr/bin/env python3
"""Regenerate contract/metrics-<version>-<mode>.txt: the exposition text the REAL SGLang metrics collector writes.

    python real_metrics.py /path/to/unpacked/sglang null|prefill|decode observe > metrics-<ver>-<mode>.txt

Needs prometheus_client and an unpacked sglang wheel (pip download --no-deps sglang==VER; unzip): only
srt/observability/metrics_collector.py, srt/environ.py, srt/observability/utils.py and srt/utils/gauge_histogram.py are
loaded, from the wheel, with stand-ins for their heavy imports (torch-free). Observations: three finished requests
(one with cached_tokens_details device 60 + host 40, one without details -> the "total" fallback, one without a hit),
realtime tokens of each mode, one log_stats, and on a prefill one KV transfer. tests/unit/test_sglang_stub.py checks
the stub's /metrics families (name, type, label names, HELP) against these files.
Load sglang's REAL metrics_collector.py (from an unpacked wheel) with light stand-ins for its heavy imports,
observe what the stub emulates, print the multiprocess exposition (as /metrics serves it)."""
import enum
import importlib.util
import os
import sys
import tempfile
import types

# prometheus_client picks its multiprocess value class when it is imported: the directory must be set first
os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp()
from prometheus_client import CollectorRegistry, generate_latest, multiprocess

ROOT = sys.argv[1]  # .../sglang


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


for pkg in ("sglang", "sglang.srt", "sglang.srt.observability", "sglang.srt.utils", "sglang.srt.disaggregation",
            "sglang.srt.model_executor", "sglang.srt.debug_utils", "sglang.srt.managers"):
    sys.modules[pkg] = types.ModuleType(pkg)
    sys.modules[pkg].__path__ = []
sys.modules["sglang.srt.debug_utils.cuda_coredump"] = types.ModuleType("x")


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"

    @staticmethod
    def to_engine_type(mode):
        return {"null": "unified", "prefill": "prefill", "decode": "decode"}[mode]


du = types.ModuleType("sglang.srt.disaggregation.utils")
du.DisaggregationMode = DisaggregationMode
sys.modules[du.__name__] = du
fb = types.ModuleType("sglang.srt.model_executor.forward_batch_info")
fb.ForwardMode = enum.IntEnum("ForwardMode", "EXTEND DECODE")
sys.modules[fb.__name__] = fb
sa = types.ModuleType("sglang.srt.server_args")
sa.ServerArgs = object
sys.modules[sa.__name__] = sa
u = sys.modules["sglang.srt.utils"]
u.get_bool_env_var = lambda n, default="false": os.getenv(n, default).lower() in ("true", "1")
load("sglang.srt.environ", ROOT + "/srt/environ.py")
load("sglang.srt.observability.utils", ROOT + "/srt/observability/utils.py")
load("sglang.srt.utils.gauge_histogram", ROOT + "/srt/utils/gauge_histogram.py")
mc = load("sglang.srt.observability.metrics_collector", ROOT + "/srt/observability/metrics_collector.py")


class Args:
    def __getattr__(self, name):
        return None


args = Args()
args.enable_metrics = True
args.prefill_delayer_max_delay_passes = 30
args.should_export_expert_balancedness_to_prometheus = lambda: False
mode = sys.argv[2]
engine = {"null": "unified", "prefill": "prefill", "decode": "decode"}[mode]
tl = {"model_name": "M", "engine_type": engine}
tok = mc.TokenizerMetricsCollector(server_args=args, labels=tl)
sl = {"model_name": "M", "engine_type": engine, "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
sch = mc.SchedulerMetricsCollector(labels=sl, enable_lora=False, enable_hierarchical_cache=False,
                                   enable_streaming_session=False, server_args=args)
if len(sys.argv) > 3 and sys.argv[3] == "observe":
    tok.observe_one_finished_request(tl, prompt_tokens=102, generation_tokens=7, cached_tokens=100, e2e_latency=0.5,
                                     has_grammar=False, cached_tokens_details={"device": 60, "host": 40}, is_streaming=False)
    tok.observe_one_finished_request(tl, prompt_tokens=10, generation_tokens=7, cached_tokens=3, e2e_latency=0.5,
                                     has_grammar=False, cached_tokens_details=None, is_streaming=True)
    tok.observe_one_finished_request(tl, prompt_tokens=10, generation_tokens=7, cached_tokens=0, e2e_latency=0.5,
                                     has_grammar=False, cached_tokens_details={"device": 0, "host": 0}, is_streaming=True)
    sch.increment_realtime_tokens(None, prefill_compute_tokens=5, prefill_cache_tokens=100, decode_tokens=7)
    st = mc.SchedulerStats()
    sch.log_stats(st)
    if mode == "prefill":
        sch.observe_kv_transfer_metrics(latency_ms=3.0, total_mb=0.4, speed_gb_s=1.0)
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
sys.stdout.write(generate_latest(registry).decode())
