"""The serving contract the sglang role relies on, run through the REAL sglang 0.5.17 / 0.5.18 code (CPU venvs).

    pytest -m real_parser tests/parser/test_roles_contract.py

tests/parser/roles_contract_probe.py runs inside each version's venv and prints what sglang's own code produces: the
/v1/loads bodies of its SchedulerLoadInquirer.get_loads over fake scheduler queues, its environment defaults, its
auth decisions. The rolling drain's reader (roles/sglang/files/sglang_probe.py parse_loads / drain_state) must read
those bodies right, and a version bump that changes a field name, a default the profiles override, or the auth level
of /v1/loads fails here.
"""
import json
import pathlib
import subprocess

import pytest
import yaml

import loadgen
import sglang_probe as sp

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / "tools" / "sglang_argcheck" / "build_venv.sh"
PROBE = pathlib.Path(__file__).resolve().parent / "roles_contract_probe.py"

pytestmark = pytest.mark.real_parser
VERSIONS = ("0.5.17", "0.5.18")


@pytest.fixture(scope="module", params=VERSIONS)
def real(request):
    proc = subprocess.run([str(BUILD), request.param], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        pytest.fail("building the sglang %s CPU venv failed (rc %d): %s" % (request.param, proc.returncode,
                                                                           proc.stderr[-2000:]))
    venv = pathlib.Path(proc.stdout.strip().splitlines()[-1])
    out = subprocess.run([str(venv / "bin" / "python"), str(PROBE)], capture_output=True, text=True, timeout=600,
                         cwd=str(ROOT))
    assert out.returncode == 0, out.stderr[-3000:]
    data = json.loads(out.stdout)
    assert data["version"] == request.param
    return data


BUSY = {
    # case: the counters the drain must report (dp rank 0), from the queues roles_contract_probe.py filled
    "prefill_kv_in_flight": {"dp0.prefill_inflight_queue_reqs": 2},
    "prefill_bootstrapping": {"dp0.num_waiting_reqs": 1, "dp0.prefill_bootstrap_queue_reqs": 1},
    "prefill_chunked": {"dp0.num_waiting_uncached_tokens": 65536 - 16384},
    "decode_waiting_for_kv": {"dp0.num_waiting_reqs": 1, "dp0.decode_transfer_queue_reqs": 1},
    "decode_prealloc": {"dp0.num_waiting_reqs": 1, "dp0.decode_prealloc_queue_reqs": 1},
    "decode_running": {"dp0.num_running_reqs": 3},
    "regular_running": {"dp0.num_running_reqs": 1, "dp0.num_waiting_reqs": 2, "dp0.num_waiting_uncached_tokens": 200},
}


@pytest.mark.parametrize("case", sorted(BUSY) + ["prefill_idle", "decode_idle", "regular_idle"])
def test_drain_reads_what_the_real_load_inquirer_reports(real, case):
    got = sp.parse_loads(real["loads"][case])
    assert got["busy"] == BUSY.get(case, {}), case
    assert got["ranks"] == 1 and set(got["ts"]) == {"0"}


def test_a_prefill_whose_kv_is_still_moving_looks_idle_to_the_deprecated_get_load(real):
    """Why the drain reads /v1/loads: /get_load's num_reqs is running + waiting, so a prefill that only has KV
    transfers in flight reports 0 there (http_server.get_load), while /v1/loads says 2."""
    assert sp.parse_loads(real["legacy"]["prefill_kv_in_flight"], legacy=True)["busy"] == {}
    assert sp.parse_loads(real["loads"]["prefill_kv_in_flight"])["busy"]


def test_two_snapshots_in_a_row_prove_the_drain(real):
    idle = sp.parse_loads(real["loads"]["prefill_idle"])
    newer = dict(idle, ts={"0": idle["ts"]["0"] + 1.0})
    assert not sp.drain_state(None, idle)
    assert not sp.drain_state(idle, idle), "the same (possibly stale) snapshot twice proves nothing"
    assert sp.drain_state(idle, newer)
    assert not sp.drain_state(sp.parse_loads(real["loads"]["prefill_kv_in_flight"]), newer)


def test_environment_defaults_the_profiles_override(real):
    # -1 = 600 s non-PD / 1800 s PD warm-up timeout; 5 s uvicorn keep-alive; /health is a generation
    # the PD bounds issue 32 shortens on glm52_pd (prefill: orphaned by a dead decode; decode: a stuck transfer):
    # both 300 s in the pinned versions, and the profile's values are the int() SGLang's EnvInt parses
    assert real["env"] == {"SGLANG_WARMUP_TIMEOUT": -1, "SGLANG_TIMEOUT_KEEP_ALIVE": 5,
                           "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": True,
                           "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": 300, "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": 300}
    prof = yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "profiles" / "glm52_pd.yml").read_text())
    boot = int(prof["roles"]["prefill"]["env"]["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"])
    wait = int(prof["roles"]["decode"]["env"]["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"])
    assert 0 < boot < real["env"]["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"]
    assert 0 < wait < real["env"]["SGLANG_DISAGGREGATION_WAITING_TIMEOUT"]


def test_v1_loads_needs_the_key_and_health_does_not(real):
    assert real["auth"] == {"/v1/loads no key": {"allowed": False, "status": 401},
                            "/v1/loads key": {"allowed": True, "status": None},
                            "/v1/loads wrong key": {"allowed": False, "status": 401},
                            "/health no key": {"allowed": True, "status": None}}


@pytest.mark.parametrize("parser", ["glm45", "kimi_k3"])
def test_a_short_reasoning_answer_is_an_answer(real, parser):
    """A 16-token answer of a reasoning model is all think block: content "" and the text in reasoning_content
    (real ReasoningParser + protocol classes). loadgen (and tools/reliability.py through it) count it as answered."""
    c = real["chat"][parser]
    assert c["content"] == "" and c["reasoning"]
    assert loadgen.extract_answer(c["json"], False) == ("", c["reasoning"])
    assert loadgen.extract_text(c["json"], False) == c["reasoning"]
    assert loadgen.extract_text(c["sse"], True) == c["reasoning"]
