"""The serving contract checked against the REAL pinned packages (SGLang 0.5.17 and 0.5.18, sglang-router 0.3.2), on
CPU, for issue 20. A version bump that changes a point the project relies on fails here, naming the project file.

Run as its own step with the parser tests:  pytest -m real_parser tests/parser
Each version's venv is tools/acceptance/contract_venv.sh <ver>: the CPU venv of tools/sglang_argcheck/build_venv.sh
layered under real prometheus-client, triton (CPU), the http_server import deps and the sglang-router 0.3.2 wheel.
A venv that cannot be built FAILS the module (no skip). tests/parser/real_contract_probe.py runs inside it and
prints what the real code does; this file judges it with the project's own code.

Stand-ins: none for the code under test. The probe keeps tools/sglang_argcheck/standins on sys.path AFTER the real
packages (torchvision is not installed; nothing probed reaches it), and the bench_serving import needs the `datasets`
package only for its MMMU loader: sandbox/client_standins/datasets satisfies that import (get_auth_headers and
flush_server_cache, the code read, never touch it). The metrics collector gets the real ServerArgs dataclass with
its defaults (its __post_init__ needs a model on disk and is skipped).

Points (sglang-real-contract.md rows):
  D2/D3/D6 real TokenizerMetricsCollector fed finished requests with and without cached_tokens_details; its
           /metrics text (multiprocess collector mounted by the real add_prometheus_middleware, fetched over ASGI)
           and its single-process exposition (with _created series) read by module_utils/sglang/sglang_metrics.py and by the
           acceptance client: the counted cached and prompt tokens equal what was fed, per engine type;
  D1/E1/.. the real app's route table holds every path + method of tests/parser/worker_endpoints.yml, and no
           project file calls a real worker route missing from that list;
  A2/A3/H1 environ defaults: health generation on, /health timeout 20 s, warm-up -1 -> 600 s / 1800 s (PD) and the
           server killed when it fails, keep-alive 5 s;
  H2       sglang-router 0.3.2 argument defaults the profiles leave to the router;
  H3/E1    bench_serving's auth header comes from OPENAI_API_KEY (real get_auth_headers) and its --flush-cache is one
           unretried POST that raises on a 400 (why the acceptance client flushes itself);
  A5       after SIGTERM with nothing left to drain the real sigterm_watchdog asks the schedulers to shut down, then
           kill_process_tree(own pid, include_parent=True), which ends the process with SIGKILL (really run in a fork);
  reasoning whether a chat request thinks (real serving_chat _get_reasoning_from_request with the real glm45 /
           kimi_k3 detectors) equals the stub's thinking_enabled for every chat_template_kwargs the probes send.
"""
import json
import pathlib
import re
import subprocess
import time

import pytest
import yaml

import acceptance_client
import sglang_stub
from ansible_collections.b300.rollout.plugins.module_utils.verdicts import acceptance

# the module_utils file flat, as the client imports it (the acceptance role ships sglang_metrics.py next to the client)
sglang_metrics = acceptance_client.sglang_metrics

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERSIONS = ("0.5.17", "0.5.18")
PROBE = pathlib.Path(__file__).with_name("real_contract_probe.py")
ENDPOINTS = pathlib.Path(__file__).with_name("worker_endpoints.yml")
MU = ROOT / "collections" / "ansible_collections" / "b300" / "rollout" / "plugins" / "module_utils"
CLIENT_DIR = ROOT / "roles" / "acceptance" / "files"

pytestmark = pytest.mark.real_parser
TIMINGS = {}


class _Venvs(dict):
    """{version: python of its contract venv}, built on first use (a failed build FAILS the test, never skips)."""

    def __missing__(self, ver):
        t0 = time.monotonic()
        proc = subprocess.run([str(ROOT / "tools" / "acceptance" / "contract_venv.sh"), ver], capture_output=True,
                              text=True, timeout=3600, check=False)
        TIMINGS["venv_%s_s" % ver] = round(time.monotonic() - t0, 1)
        if proc.returncode != 0:
            pytest.fail("building the sglang %s contract venv failed (rc %d):\n%s" % (
                ver, proc.returncode, proc.stderr[-3000:]))
        self[ver] = proc.stdout.strip().splitlines()[-1]
        return self[ver]


@pytest.fixture(scope="session")
def contract_venvs():
    return _Venvs()


_CACHE = {}
# one process per group: a single sglang import serves every probe of the group (CI time)
GROUPS = (("metrics", "routes", "environ", "bench_auth", "router_args", "thinking", "sigterm"), ("metrics_single",))


def probe(venvs, ver, what):
    """What the real code of version `ver` says on `what` (see real_contract_probe.py); cached per session."""
    group = next(g for g in GROUPS if what in g)
    if (ver, group) not in _CACHE:
        t0 = time.monotonic()
        proc = subprocess.run([venvs[ver], str(PROBE), *group], capture_output=True, text=True, timeout=600,
                              cwd=str(ROOT), check=False)
        TIMINGS["probe_%s_%s_s" % (ver, group[0])] = round(time.monotonic() - t0, 1)
        assert proc.returncode == 0 and "@@JSON@@" in proc.stdout, "probe %s on %s failed (rc %d):\n%s" % (
            " ".join(group), ver, proc.returncode, proc.stderr[-4000:])
        out = json.loads(proc.stdout.rsplit("@@JSON@@", 1)[1])
        assert out["_sglang"] == ver, "the %s venv runs sglang %s" % (ver, out["_sglang"])
        _CACHE[(ver, group)] = out
    return _CACHE[(ver, group)][what]


# ------------------------------------------------------------------------------------------------ D2: cached tokens
@pytest.mark.parametrize("ver", VERSIONS)
@pytest.mark.parametrize("what", ["metrics", "metrics_single"])
def test_real_collector_text_counted_by_our_reader(contract_venvs, ver, what):
    """The real collector's exposition, read by the ONE reader: cached tokens of every source (device, host,
    storage_<backend>, and "total" for the requests fed without details) equal what was fed, per engine type; prompt
    tokens too (summed over is_streaming). Relied on by module_utils/verdicts/acceptance.py server_cache_hit (the cache_miss
    verdict) and roles/acceptance/files/acceptance_client.py (samples.jsonl, progress)."""
    out = probe(contract_venvs, ver, what)
    text, fed = out["text"], out["fed"]
    if what == "metrics":
        assert out["status"] == 200 and out["content_type"].startswith("text/plain; version=0.0.4")
    samples = sglang_metrics.parse(text)
    sources = sglang_metrics.cached_tokens_by_source(samples, "prefill")
    # the real label values, so a reader that keeps only one of them is caught
    assert {"device", "host", "total", "storage_HiCacheFile", "storage_unknown"} <= set(sources), sources
    for engine, want in fed.items():
        assert sglang_metrics.cached_tokens(samples, engine) == want["cached"], (ver, engine, sources)
        assert acceptance.counter_sum(samples, sglang_metrics.PROMPT_TOKENS, engine) == want["prompt"], (ver, engine)
        assert acceptance.counter_sum(samples, sglang_metrics.NUM_REQUESTS, engine) == want["requests"], (ver, engine)
    # the model label survived its escapes (quotes, backslash, newline, braces, comma)
    names = {lab.get("model_name") for n, lab, _ in samples if n == sglang_metrics.CACHED_TOKENS}
    assert names == {'GLM-5.2 "nvfp4" {tp=8}, a\\b\nc'}, names
    if what == "metrics_single":
        assert any(n == "sglang:cached_tokens_created" for n, _, _ in samples), "no _created series: not the format"
    # the module's server-side hit and the client's per-worker summary agree with what was fed
    hit = acceptance.server_cache_hit({"u": ""}, {"u": text}, "prefill")
    assert (hit["cached_tokens"], hit["prompt_tokens"]) == (fed["prefill"]["cached"], fed["prefill"]["prompt"])
    summary = acceptance_client.summarize({"u": text})["u"]
    total_fed = sum(v["cached"] for v in fed.values())
    assert summary[sglang_metrics.CACHED_TOKENS] == total_fed
    assert summary[sglang_metrics.PROMPT_TOKENS] == sum(v["prompt"] for v in fed.values())


@pytest.mark.parametrize("ver", VERSIONS)
def test_only_total_or_only_breakdown_would_be_wrong(contract_venvs, ver):
    """Guard on the rule itself with the real text: dropping "total" loses the requests fed without details, keeping
    only "total" (the old reader) loses every request that had them."""
    out = probe(contract_venvs, ver, "metrics")
    samples = sglang_metrics.parse(out["text"])
    fed = out["fed"]["prefill"]["cached"]
    only_total = sglang_metrics.counter_sum(samples, sglang_metrics.CACHED_TOKENS, "prefill", cache_source="total")
    by_source = sglang_metrics.cached_tokens_by_source(samples, "prefill")
    assert 0 < only_total < fed and sum(v for k, v in by_source.items() if k != "total") < fed


# ------------------------------------------------------------------------------------------------ routes
def _project_endpoints():
    return yaml.safe_load(ENDPOINTS.read_text())["endpoints"]


@pytest.mark.parametrize("ver", VERSIONS)
def test_route_table_holds_every_worker_call(contract_venvs, ver):
    routes = probe(contract_venvs, ver, "routes")["routes"]
    table = {}
    for r in routes:
        table.setdefault(r["path"], set()).update(r["methods"] or (["*"] if r["kind"] == "Mount" else []))
    missing = []
    for e in _project_endpoints():
        methods = table.get(e["path"], set())
        if e["method"] not in methods and "*" not in methods:
            missing.append("%s %s (used by %s: %s) - real %s serves %s" % (
                e["method"], e["path"], e["used_by"], e["why"], ver, sorted(methods) or "nothing there"))
    assert not missing, "\n".join(missing)
    # /metrics is a Mount added only with --enable-metrics (profiles set it: glm52_pd.yml, kimi_k3.yml)
    assert any(r["path"] == "/metrics" and r["kind"] == "Mount" for r in routes)


def test_worker_endpoint_list_is_current_and_complete(contract_venvs):
    """Each listed caller still names its path; every real worker route a project caller names is listed."""
    listed = {e["path"] for e in _project_endpoints()}
    for e in _project_endpoints():
        if e["used_by"] != "router":
            assert e["path"] in (ROOT / e["used_by"]).read_text(), "%s no longer names %s" % (e["used_by"], e["path"])
    real = set()
    for ver in VERSIONS:
        real |= {r["path"] for r in probe(contract_venvs, ver, "routes")["routes"] if len(r["path"]) > 1}
    callers = [p for p in list((ROOT / "roles").glob("*/files/*.py")) + list((ROOT / "roles").glob("*/tasks/*.yml"))
               + list((ROOT / "tools").glob("*.py")) if "sglang_stub" not in str(p)]
    unlisted = {}
    for f in callers:
        text = f.read_text(errors="replace")
        for path in real - listed:
            if re.search(r"""["'/}]%s(?=["'?\s])""" % re.escape(path), text):
                unlisted.setdefault(path, []).append(str(f.relative_to(ROOT)))
    assert not unlisted, "worker routes called but not in %s: %s" % (ENDPOINTS.name, unlisted)


# ------------------------------------------------------------------------------------------------ environ defaults
@pytest.mark.parametrize("ver", VERSIONS)
def test_health_endpoint_is_a_generation_with_20s_timeout(contract_venvs, ver):
    """roles/sglang/files/sglang_probe.py and the glm52_pd router health checks (profiles/glm52_pd.yml, endpoint
    left at the router's /health) rely on /health being a real generation (A3) that answers 503 after 20 s."""
    env = probe(contract_venvs, ver, "environ")
    assert env["SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"] is True
    assert env["HEALTH_CHECK_TIMEOUT"] == 20


@pytest.mark.parametrize("ver", VERSIONS)
def test_warmup_timeout_default_600_non_pd_1800_pd_then_killed(contract_venvs, ver):
    """roles/sglang/defaults/main.yml sglang_health_timeout_s (the deploy's wait) and the per-profile warm-up timeout
    the roles set rely on: SGLANG_WARMUP_TIMEOUT defaults to -1, which means a 600 s warm-up request (non-PD) and
    1800 s (PD), after which the server kills itself (A2)."""
    env = probe(contract_venvs, ver, "environ")
    assert env["SGLANG_WARMUP_TIMEOUT"] == -1
    assert env["warmup_fallbacks"] == ["timeout=warmup_timeout if warmup_timeout > 0 else 600,",
                                       "timeout=warmup_timeout if warmup_timeout > 0 else 1800,"]
    assert env["warmup_kills_server"]


@pytest.mark.parametrize("ver", VERSIONS)
def test_keep_alive_5s(contract_venvs, ver):
    """roles/sglang/files/profiles/*.yml router retry settings assume the worker closes idle keep-alive connections
    after 5 s (H1: a pooled connection racing that close gives a sporadic error that only a retry hides)."""
    assert probe(contract_venvs, ver, "environ")["SGLANG_TIMEOUT_KEEP_ALIVE"] == 5


# ------------------------------------------------------------------------------------------------ router defaults
ROUTER_DEFAULTS = {
    # what the project leaves to the router, and which file relies on it
    "policy": ("cache_aware", "module_utils/verdicts/acceptance.py router_policy (no --policy -> cache_aware, 1 cache domain)"),
    "health_check_endpoint": ("/health", "profiles/glm52_pd.yml (no --health-check-endpoint)"),
    "health_check_timeout_secs": (5, "profiles/glm52_pd.yml (no --health-check-timeout-secs)"),
    "health_success_threshold": (2, "profiles/glm52_pd.yml (no --health-success-threshold)"),
    "retry_max_retries": (5, "profiles/*.yml resilient set (retries on, count left to the router)"),
    "request_timeout_secs": (1800, "profiles/glm52_pd.yml (no --request-timeout-secs)"),
}


def test_router_032_defaults(contract_venvs):
    out = probe(contract_venvs, VERSIONS[0], "router_args")
    assert out["version"] == "0.3.2"
    wrong = ["%s: real %r, project relies on %r (%s)" % (k, out["defaults"].get(k), v, who)
             for k, (v, who) in ROUTER_DEFAULTS.items() if out["defaults"].get(k) != v]
    assert not wrong, "\n".join(wrong)


def test_router_defaults_are_really_left_to_the_router():
    """The files named above really leave those flags unset (else the default is not what they rely on)."""
    glm = yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "profiles" / "glm52_pd.yml").read_text())
    # the seed flag set (router.args alone) leaves them to the router; the resilient set may override some
    # (--health-check-timeout-secs 25: the profile says why) and is checked by its own tests
    for flag in ("--health-check-endpoint", "--health-check-timeout-secs", "--health-success-threshold"):
        assert flag not in glm["router"]["args"], flag
        assert flag not in (glm["router_flag_sets"].get("seed") or {}), flag
        assert flag not in yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "router_flag_sets.yml").read_text())["seed"]
    assert acceptance.router_policy([], "regular") == "cache_aware"


# ------------------------------------------------------------------------------------------------ bench_serving
@pytest.mark.parametrize("ver", VERSIONS)
def test_bench_serving_auth_from_openai_api_key(contract_venvs, ver):
    """roles/acceptance/files/acceptance_client.py child_env gives bench_serving the key as OPENAI_API_KEY (Bearer)
    and removes API_KEY (sent without "Bearer"): the real get_auth_headers."""
    out = probe(contract_venvs, ver, "bench_auth")
    assert out["none"] == {}
    assert out["openai"] == {"Authorization": "Bearer k-openai"}
    assert out["api_key"] == {"Authorization": "k-plain"}
    assert out["both"] == {"Authorization": "Bearer k-openai"}
    env = acceptance_client.child_env({"env": {}}, "k-openai")
    assert env["OPENAI_API_KEY"] == "k-openai" and "API_KEY" not in env


@pytest.mark.parametrize("ver", VERSIONS)
def test_bench_serving_flush_is_one_unretried_post(contract_venvs, ver):
    """module_utils/verdicts/acceptance.py bench_argv leaves --flush-cache out because of this: ONE POST through the router
    that raise_for_status()es on the 400 of a worker that is not idle. 0.5.17 sends no ?timeout at all; 0.5.18 adds
    ?timeout=60 for the sglang backend (the server then waits up to 60 s for idle), still a single attempt whose
    pass-through by router 0.3.2's fan-out is not known. The acceptance client's own per-worker flush (?timeout and
    bounded retries) behaves the same on both versions."""
    src = probe(contract_venvs, ver, "bench_auth")["flush_server_cache"]
    assert src.count("raise_for_status()") == 1 and "for " not in src and "while " not in src, src
    if ver == "0.5.17":
        assert "timeout" not in src, src
    else:
        assert 'params={"timeout": flush_cache_timeout}' in src and "= _DEFAULT_SGLANG_FLUSH_CACHE_TIMEOUT" in src
    argv = acceptance.bench_argv("py", acceptance.scaled_shape(
        {"input_len": 4096, "output_len": 64, "hit_rate": 0.77, "groups": 3, "prompts_per_group": 20,
         "request_rate": 9, "max_concurrency": 8}), "http://r", "m", "/t", "o", "t")
    assert "--flush-cache" not in argv and argv[argv.index("--warmup-requests") + 1] == "0"


# ------------------------------------------------------------------------------------------------ reasoning on/off
@pytest.mark.parametrize("ver", VERSIONS)
def test_thinking_switch_of_the_stub_is_the_real_one(contract_venvs, ver):
    """The stub's thinking_enabled (sandbox/sglang_stub/sglang_stub.py) decides like the real serving_chat for both
    profiles' parsers: glm45 reads enable_thinking, kimi_k3 reads thinking, each thinks unless its key is false. The
    reboot/secrets probes and the molecule verify send {"thinking": false} to kimi_k3 to get the answer in content;
    a version whose default or key changes fails here (the template-driven path of a real model's chat template is
    not covered: no model files in the venv)."""
    cases = probe(contract_venvs, ver, "thinking")
    assert len(cases) == 14, cases
    assert {c["parser"]: c["reasoning_default"] for c in cases} == {"glm45": "enable_thinking", "kimi_k3": "thinking"}
    wrong = [c for c in cases if sglang_stub.thinking_enabled(c["parser"], {"chat_template_kwargs": c["chat_template_kwargs"]})
             != c["thinks"]]
    assert not wrong, "the stub decides these differently from sglang %s: %s" % (ver, wrong)
    # the switch the project relies on, read from the real answers (not from the stub)
    real = {(c["parser"], json.dumps(c["chat_template_kwargs"], sort_keys=True)): c["thinks"] for c in cases}
    assert real[("kimi_k3", '{"thinking": false}')] is False and real[("kimi_k3", "null")] is True
    assert real[("glm45", '{"enable_thinking": false}')] is False and real[("glm45", '{"thinking": false}')] is True


# ------------------------------------------------------------------------------------------------ A5: SIGTERM
@pytest.mark.parametrize("ver", VERSIONS)
def test_sigterm_ends_in_sigkill_of_the_worker_itself(contract_venvs, ver):
    """roles/sglang/tasks/units.yml resets the failed state of removed units: a worker stopped by systemd (SIGTERM
    to the main process, KillMode=mixed) drains, then kills its own tree including itself, so systemd records it as
    killed by SIGKILL ("failed") although the stop was asked for. The stub does the same (sandbox/sglang_stub README,
    A5); this is the real sequence: shutdown request to the schedulers, then the tree kill of its own pid with the
    parent included, and that call ends a process with SIGKILL."""
    out = probe(contract_venvs, ver, "sigterm")
    assert out["calls"] == ["ShutdownReq", {"kill_process_tree": "own pid", "include_parent": True}], out
    assert out["exit"] == 0, out                       # sys.exit(0) after it (never reached on a real worker)
    assert out["own_kill_ends_with"] == out["SIGKILL"] == -9, out
