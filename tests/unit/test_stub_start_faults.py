"""The stub's start-time faults used by the rollback tests (issue 23; tests/integration/test_rollback.py):
`refuse_api_key` (a key this server refuses at start) and `refuse_flag:--NAME` (a flag it refuses at start). The
server exits 1 before it listens and names the fault (the refusal line never holds the key)."""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

import sglang_stub as st

ROOT = pathlib.Path(__file__).resolve().parents[2]
STUB_DIR = ROOT / "sandbox" / "sglang_stub"

KEY = "sk-b300-" + "0f1e2d3c4b5a6978" * 2


def test_start_refusal_rules():
    assert st.start_refusal({"refuse_api_key"}, ["--api-key", KEY], KEY).startswith("fault refuse_api_key")
    assert st.start_refusal({"refuse_api_key"}, [], None) is None                    # no key: starts
    assert "refuses --log-requests" in st.start_refusal({"refuse_flag:--log-requests"}, ["--log-requests"], None)
    assert st.start_refusal({"refuse_flag:--log-requests"}, ["--log-requests-level", "1"], None) is None
    assert st.start_refusal({"refuse_flag:--port"}, ["--port=30000"], None)
    assert st.start_refusal({"unhealthy"}, ["--log-requests"], KEY) is None
    assert KEY not in (st.start_refusal({"refuse_api_key"}, ["--api-key", KEY], KEY) or "")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("fault,extra,refused", [
    ("refuse_api_key", ["--api-key", KEY], True),
    ("refuse_flag:--log-requests", ["--log-requests"], True),
])
def test_stub_exits_1_at_start_and_never_prints_the_key(tmp_path, fault, extra, refused):
    port = _free_port()
    env = dict(os.environ, SGLANG_STUB_CONTROL_DIR=str(tmp_path), SGLANG_STUB_LOAD_SECONDS="0.2",
               SGLANG_STUB_HWEMU_ROOT=str(tmp_path / "no-hwemu"))
    (tmp_path / "fault").write_text(fault + "\n")
    argv = [sys.executable, str(STUB_DIR / "bin" / "sglang-0.5.18"), "serve", "--model-path", "/m", "--host",
            "127.0.0.1", "--port", str(port)] + extra
    r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
    assert r.returncode == 1, r.stderr[-2000:]
    # SGLang's log format has no level (sglang_stub.log): the refusal is the one line "[ts] fault NAME: ..."
    refusal = [line for line in r.stderr.splitlines() if "] fault %s: " % fault in line]
    assert len(refusal) == 1 and KEY not in refusal[0], r.stderr[-2000:]
    # (the banner before it echoes argv like the real server's server_args line; the units' launcher redacts both)
