"""The sglang role's timeouts and unit settings checked against each other and against what real SGLang 0.5.17/0.5.18
does (numbers from the source; tests/parser/test_roles_contract.py runs the real code for the defaults)."""
import pathlib
import re

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
UNIT = (ROLE / "templates" / "etc" / "systemd" / "system" / "sglang-instance.service.j2").read_text()
ROUTER_UNIT = (ROLE / "templates" / "etc" / "systemd" / "system" / "sglang-router.service.j2").read_text()
PROFILES = {p.stem: yaml.safe_load(p.read_text()) for p in (ROLE / "files" / "profiles").glob("*.yml")}

# real SGLang (both versions)
WARMUP_DEFAULT = {"regular": 600, "pd": 1800}        # http_server.py 17:2281/2297, 18:2307/2323 (-1 => these)
HEALTH_CHECK_TIMEOUT = 20                            # http_server.py:192 SGLANG_HEALTH_CHECK_TIMEOUT
HEALTH_POLL = 1                                      # the /health handler sleeps 1 s per loop
DRAIN_STEP, SHUTDOWN_WAIT = 5, 15                    # tokenizer_manager.sigterm_watchdog
ROUTER_POOL_IDLE = 180     # router 0.3.2 idle pooled connections: closed after 87-97 s and 177 s (tools/router_pool_idle.py)
COLD_LOAD_BUDGET = 1800                              # weights + graphs before the warm-up (defaults comment)


def worker_envs():
    for name, prof in PROFILES.items():
        for role, spec in prof["roles"].items():
            yield name, prof["mode"], role, spec.get("env") or {}


@pytest.mark.parametrize("name,mode,role,env", list(worker_envs()), ids=lambda v: v if isinstance(v, str) else "")
def test_warmup_timeout_is_set_above_a_cold_start_and_inside_the_health_wait(name, mode, role, env):
    warm = int(env["SGLANG_WARMUP_TIMEOUT"])
    assert warm >= WARMUP_DEFAULT[mode], "below SGLang's own default for %s" % mode
    assert warm >= 1800, "a cold JIT first forward takes 10-20 min"
    # the role's health wait must outlast SGLang's own verdict (a warm-up that times out kills the server)
    assert DEFAULTS["sglang_health_timeout_s"] >= COLD_LOAD_BUDGET + warm
    # and a warm-up crash loop cannot exhaust the unit's start limit (each attempt lasts at least the warm-up)
    interval, burst = DEFAULTS["sglang_start_limit_interval_s"], DEFAULTS["sglang_start_limit_burst"]
    assert interval == 0 or interval < burst * warm
    assert "Restart=on-failure" in UNIT


@pytest.mark.parametrize("name,mode,role,env", list(worker_envs()), ids=lambda v: v if isinstance(v, str) else "")
def test_worker_keep_alive_outlasts_the_router_pool(name, mode, role, env):
    assert int(env["SGLANG_TIMEOUT_KEEP_ALIVE"]) > ROUTER_POOL_IDLE


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_resilient_router_health_check_sees_the_workers_own_verdict(name):
    shared = yaml.safe_load((ROLE / "files" / "router_flag_sets.yml").read_text())
    flags = dict(PROFILES[name]["router"]["args"], **sp.router_flag_set(PROFILES[name], shared, "resilient"))
    assert flags.get("--health-check-endpoint", "/health") == "/health"
    assert int(flags["--health-check-timeout-secs"]) > HEALTH_CHECK_TIMEOUT + HEALTH_POLL


def test_units_drain_on_stop():
    assert re.findall(r"^KillMode=.*$", UNIT, re.M) == ["KillMode=mixed"]
    assert re.search(r"^KillMode=mixed$", ROUTER_UNIT, re.M)
    assert "TimeoutStopSec={{ sglang_stop_timeout_s }}" in UNIT
    assert DEFAULTS["sglang_stop_timeout_s"] > DRAIN_STEP + SHUTDOWN_WAIT


def test_probe_timeout_outlasts_the_health_generation():
    src = (ROLE / "files" / "sglang_probe.py").read_text()
    m = re.search(r'add_argument\("--timeout", type=float, default=(\d+)\)', src)
    assert m and int(m.group(1)) > HEALTH_CHECK_TIMEOUT + HEALTH_POLL


def test_drain_defaults():
    assert DEFAULTS["sglang_rolling_drain_timeout_s"] > 0
    assert 0 < DEFAULTS["sglang_rolling_drain_poll_s"] < DEFAULTS["sglang_health_progress_s"]
