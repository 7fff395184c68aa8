"""Runs INSIDE the CPU venv of one pinned SGLang (tools/acceptance/contract_venv.sh) and prints JSON: what the real
code says on each contract point. tests/parser/test_real_contract.py judges it with the project's own readers.

    python real_contract_probe.py metrics routes environ bench_auth router_args    (one process)
    python real_contract_probe.py metrics_single                                   (alone)

No stand-in replaces code under test. sys.path gets tools/sglang_argcheck/standins AFTER the real site-packages
(only torchvision is missing from the venv; nothing here reaches it). triton is the real CPU wheel: torch's
flop_counter needs real triton types at import time. Each probe imports the sglang modules it reads inside its
function: a run imports only what its probes need.
"""
import dataclasses
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.append(os.path.join(ROOT, "tools", "sglang_argcheck", "standins"))

# label values with every character the exposition escapes or that a naive reader trips on
MODEL = 'GLM-5.2 "nvfp4" {tp=8}, a\\b\nc'
# requests fed to the collector: (engine_type, prompt, cached, details or None)
FED = [
    ("prefill", 4096, 3968, {"device": 3968, "host": 0}),            # a device hit (what the scheduler sends)
    ("prefill", 4096, 4032, {"device": 1024, "host": 3008}),         # hierarchical cache: device + host
    ("prefill", 4096, 0, None),                                       # a miss: no cached tokens, no details
    ("prefill", 8192, 2048, None),                                    # no breakdown: the "total" fallback
    ("prefill", 8192, 6144, {"device": 2048, "host": 1024, "storage": 3072, "storage_backend": "HiCacheFile"}),
    ("prefill", 2048, 1000, {"device": 0, "host": 0, "storage": 1000}),  # storage without a backend name
    ("decode", 4096, 3968, {"device": 3968, "host": 0}),             # PD decode copies the prefill's counts
    ("unified", 1_500_000, 1_234_567, {"device": 1_234_567, "host": 0}),   # exponent territory
]


def server_args():
    """The real ServerArgs with its dataclass defaults, without __post_init__ (which needs a model on disk)."""
    from sglang.srt.server_args import ServerArgs
    sa = ServerArgs.__new__(ServerArgs)
    for f in dataclasses.fields(ServerArgs):
        if f.default is not dataclasses.MISSING:
            setattr(sa, f.name, f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            setattr(sa, f.name, f.default_factory())  # type: ignore[misc]
        else:
            setattr(sa, f.name, None)
    sa.served_model_name = MODEL
    sa.enable_metrics = True
    return sa


def feed():
    from sglang.srt.observability.metrics_collector import TokenizerMetricsCollector
    # the label names TokenizerManager.init_metric_collector_watchdog builds (tokenizer_manager.py); one collector
    # per process like a server (a second one would register the same series twice). The label VALUES come with
    # each call, so one collector writes the three engine types' label sets.
    collector = TokenizerMetricsCollector(server_args=server_args(), labels={"model_name": MODEL,
                                                                           "engine_type": "prefill"})
    for i, (engine, prompt, cached, details) in enumerate(FED):
        collector.observe_one_finished_request(
            {"model_name": MODEL, "engine_type": engine}, prompt, 16, cached, 0.5, False, details,
            is_streaming=bool(i % 2))
    return collector


def fed_summary():
    out = {}
    for engine, prompt, cached, _ in FED:
        e = out.setdefault(engine, {"prompt": 0, "cached": 0, "requests": 0})
        e["prompt"] += prompt
        e["cached"] += cached
        e["requests"] += 1
    return out


def metrics():
    """What a real server serves at /metrics: prometheus_client's multiprocess collector mounted by the real
    add_prometheus_middleware on the real FastAPI app, fetched through an ASGI test client."""
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="sglang-contract-prom-")
    feed()
    from sglang.srt.utils.common import add_prometheus_middleware
    from fastapi import FastAPI
    from starlette.testclient import TestClient
    app = FastAPI()
    add_prometheus_middleware(app)
    resp = TestClient(app).get("/metrics")
    return {"status": resp.status_code, "content_type": resp.headers.get("content-type"), "text": resp.text,
            "fed": fed_summary()}


def metrics_single():
    """The single-process exposition (prometheus_client.generate_latest of the default registry): the same
    counters plus their `_created` series."""
    os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    feed()
    import prometheus_client
    return {"text": prometheus_client.generate_latest().decode(), "fed": fed_summary(),
            "prometheus_client": prometheus_client.__version__ if hasattr(prometheus_client, "__version__") else
            __import__("importlib.metadata").metadata.version("prometheus_client")}


def routes():
    """(path, [methods]) of the real app's route table, with /metrics mounted as a server with --enable-metrics."""
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="sglang-contract-prom-"))
    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils.common import add_prometheus_middleware
    app = http_server.app
    add_prometheus_middleware(app)   # what launch does with enable_metrics (http_server.py lifespan)
    out = []

    def walk(routes, prefix):
        for r in routes:
            inner = getattr(r, "original_router", None)
            if inner is not None:
                # FastAPI >= 0.16x keeps an included router (app.include_router(v1_loads_router): /v1/loads) as one
                # _IncludedRouter entry instead of copying its routes into app.routes: walk into it
                ctx = getattr(r, "include_context", None)
                walk(inner.routes, prefix + (getattr(ctx, "prefix", "") or ""))
                continue
            path = getattr(r, "path", None)
            if path is None:
                continue
            methods = sorted(getattr(r, "methods", None) or [])
            out.append({"path": prefix + path, "methods": methods, "kind": type(r).__name__,
                        "auth": str(getattr(getattr(r, "endpoint", None), "_auth_level", "") or "")})

    walk(app.routes, "")
    return {"routes": out}


def environ():
    """The defaults the project relies on, read from the real modules with none of the variables set."""
    names = ("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "SGLANG_HEALTH_CHECK_TIMEOUT", "SGLANG_WARMUP_TIMEOUT",
             "SGLANG_TIMEOUT_KEEP_ALIVE")
    for n in names:
        os.environ.pop(n, None)
    import inspect
    from sglang.srt.environ import envs
    from sglang.srt.entrypoints import http_server
    out = {n: getattr(envs, n).get() for n in names if hasattr(envs, n)}
    # /health's generation timeout is a module constant read at import: int(os.getenv(..., 20))
    out["HEALTH_CHECK_TIMEOUT"] = http_server.HEALTH_CHECK_TIMEOUT
    # the warm-up request's timeout when SGLANG_WARMUP_TIMEOUT <= 0: the literal fallbacks of the function that
    # sends it (non-PD first, PD second)
    src = inspect.getsource(http_server._execute_server_warmup)  # private in sglang: its source is the contract
    out["warmup_fallbacks"] = [ln.strip() for ln in src.splitlines() if "warmup_timeout if warmup_timeout > 0" in ln]
    out["warmup_kills_server"] = "kill_process_tree" in src
    return out


def bench_auth():
    # sglang.benchmark.datasets imports the `datasets` package at import time (MMMU loader); the project's client
    # stand-in (sandbox/client_standins, the same one the sandbox acceptance client uses) satisfies that import.
    # get_auth_headers, the code under test, touches none of it.
    sys.path.append(os.path.join(ROOT, "sandbox", "client_standins"))
    from sglang.benchmark import serving
    out = {}
    for case, env in (("none", {}), ("openai", {"OPENAI_API_KEY": "k-openai"}), ("api_key", {"API_KEY": "k-plain"}),
                      ("both", {"OPENAI_API_KEY": "k-openai", "API_KEY": "k-plain"})):
        for k in ("OPENAI_API_KEY", "API_KEY"):
            os.environ.pop(k, None)
        os.environ.update(env)
        out[case] = serving.get_auth_headers()
    import inspect
    out["flush_server_cache"] = inspect.getsource(serving.flush_server_cache)
    return out


def router_args():
    from sglang_router.router_args import RouterArgs
    import importlib.metadata as md
    ra = RouterArgs()
    vals = {f.name: getattr(ra, f.name) for f in dataclasses.fields(RouterArgs)}
    return {"version": md.version("sglang-router"),
            "defaults": {k: v for k, v in vals.items() if isinstance(v, (int, float, str, bool, type(None)))}}


# chat_template_kwargs the project's probes and tests send (thinking off), and their neighbours
THINKING_KWARGS = (None, {}, {"thinking": False}, {"enable_thinking": False}, {"thinking": True},
                   {"enable_thinking": True}, {"thinking": False, "enable_thinking": False})


def thinking():
    """Whether the real OpenAIServingChat._get_reasoning_from_request turns reasoning on, per profile parser (glm45,
    kimi_k3) and chat_template_kwargs, on the path a server takes when the chat template gives no reasoning config
    (template_manager.reasoning_config None: the parser's reasoning_default decides). The real detector class of
    ReasoningParser.DetectorMap provides that default; the serving object is a namespace with the three attributes
    the function reads."""
    import types
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.reasoning_parser import ReasoningParser
    out = []
    for parser in ("glm45", "kimi_k3"):
        detector = ReasoningParser.DetectorMap[parser]()
        serving = types.SimpleNamespace(reasoning_parser=parser, _reasoning_detector=detector,
                                        template_manager=types.SimpleNamespace(reasoning_config=None))
        for kwargs in THINKING_KWARGS:
            req = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}],
                                        chat_template_kwargs=kwargs)
            out.append({"parser": parser, "reasoning_default": detector.reasoning_default,
                        "chat_template_kwargs": kwargs,
                        "thinks": OpenAIServingChat._get_reasoning_from_request(serving, req)})
    return out


def sigterm():
    """What a worker does after SIGTERM, from the real code (why roles/sglang resets the removed units' failed state
    and why KillMode=mixed): TokenizerManager.sigterm_watchdog run on a namespace that has received SIGTERM with no
    request left (gracefully_exit, empty rid_to_state); the scheduler shutdown request and kill_process_tree are
    recorded instead of sent. Then the real kill_process_tree(own pid, include_parent=True) in a forked child: how
    that child ends (a negative signal number, as subprocess reports it)."""
    import asyncio
    import signal
    import types
    from sglang.srt.managers import tokenizer_manager as tm
    real_kill = tm.kill_process_tree
    saved = {n: getattr(tm, n) for n in ("kill_process_tree", "collect_scheduler_processes") if hasattr(tm, n)}
    calls, code = [], "returned"
    try:
        tm.kill_process_tree = lambda pid, include_parent=False, **kw: calls.append(
            {"kill_process_tree": "own pid" if pid == os.getpid() else pid, "include_parent": include_parent})
        tm.collect_scheduler_processes = lambda *a, **k: []
        state = types.SimpleNamespace(gracefully_exit=True, rid_to_state={}, server_status=None,
                                      _subprocess_watchdog=None,
                                      _dispatch_to_scheduler=lambda req: calls.append(type(req).__name__))
        try:
            asyncio.run(tm.TokenizerManager.sigterm_watchdog(state))
        except SystemExit as e:
            code = e.code
    finally:
        for n, v in saved.items():
            setattr(tm, n, v)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            real_kill(os.getpid(), include_parent=True)
        finally:
            os._exit(0)     # only reached if the process survived its own kill_process_tree
    _, status = os.waitpid(pid, 0)
    ended = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return {"calls": calls, "exit": code, "own_kill_ends_with": ended, "SIGKILL": -int(signal.SIGKILL)}


PROBES = ("metrics", "metrics_single", "routes", "environ", "bench_auth", "router_args", "thinking", "sigterm")


def main():
    """Run the named probes in THIS process (one sglang import for all of them): {probe: result, "_sglang": ver}.
    metrics_single cannot share a process with the others: prometheus_client picks its value class (multiprocess
    or not) once, at import."""
    import importlib.metadata as md
    names = sys.argv[1:]
    unknown = [n for n in names if n not in PROBES]
    if unknown or not names:
        sys.exit("usage: real_contract_probe.py %s ..." % "|".join(PROBES))
    if "metrics_single" in names and len(names) > 1:
        sys.exit("metrics_single runs alone")
    out = {n: globals()[n]() for n in names}
    out["_sglang"] = md.version("sglang")
    sys.stdout.write("\n@@JSON@@" + json.dumps(out, default=str) + "\n")


if __name__ == "__main__":
    main()
