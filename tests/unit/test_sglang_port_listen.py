"""The reachability preflight's listener (roles/sglang/files/sglang_port_listen.py), run as the role runs it.

The role starts the listener as an async job and, before any host connects, runs its --await form on the same host:
the await must return only once the ports are bound (CI saw a connect arrive before a late-starting listener had
bound its port, and the path was judged blocked).
"""
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

SCRIPT = (Path(__file__).resolve().parents[2] / "roles/sglang/files/sglang_port_listen.py").read_text()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(*args, **kw):
    return subprocess.run([sys.executable, "-c", SCRIPT] + [str(a) for a in args], capture_output=True, text=True,
                          timeout=60, **kw)


def test_await_returns_only_after_the_port_is_bound_and_consumes_the_ready_file(tmp_path):
    port, ready = _free_port(), tmp_path / "ready"
    # an async job that starts late: the same script, 1.5 s after its process began
    listener = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)\n" + SCRIPT,
                                 "20", str(ready), str(port)], stdout=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    waited = _run("--await", 20, ready)
    assert waited.returncode == 0, waited.stderr
    assert time.monotonic() - t0 >= 1.0, "the await returned before the (delayed) listener started"
    assert waited.stdout.strip() == str(listener.pid), "the await prints the listener's PID"
    assert not ready.exists(), "the await removes the ready file"
    # the port is bound now: connects succeed at once, and more than the one expected do not end the listener
    # (a running router's health checks come from the very host whose connect is being proven)
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        time.sleep(0.6)
    assert listener.poll() is None, "the listener left after the expected count: a later connect would be refused"
    # --stop ends it (SIGTERM, handled: it prints its record and exits 0, so async_status reports success)
    assert _run("--stop", ready, listener.pid).returncode == 0
    out, _ = listener.communicate(timeout=20)
    assert listener.returncode == 0
    assert json.loads(out) == {"listening": [port], "in_use": [], "accepted": {str(port): ["127.0.0.1"] * 3}}


def test_stop_leaves_a_process_alone_that_is_not_this_listener(tmp_path):
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert _run("--stop", tmp_path / "ready", other.pid).returncode == 0
        time.sleep(0.3)
        assert other.poll() is None, "--stop killed a process whose command line does not name the ready file"
        assert _run("--stop", tmp_path / "ready", 2 ** 22 + 7).returncode == 0, "a gone PID is nothing to stop"
    finally:
        other.kill()
        other.wait()


def test_port_in_use_is_reported_and_the_listener_is_ready_at_once(tmp_path):
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    port, ready = busy.getsockname()[1], tmp_path / "ready"
    try:
        r = _run(20, ready, str(port))
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout) == {"listening": [], "in_use": [port], "accepted": {}}
        assert ready.exists(), "nothing to bind: the ready file is there for the await to take"
        assert _run("--await", 5, ready).returncode == 0 and not ready.exists()
        assert _run("--stop", ready, 2 ** 22 + 7).returncode == 0, "a listener gone already is nothing to stop"
    finally:
        busy.close()


def test_await_fails_naming_the_file_when_no_listener_comes(tmp_path):
    ready = tmp_path / "never"
    r = _run("--await", 0.6, ready)
    assert r.returncode == 1
    assert "did not bind its ports within 0.6 s" in r.stderr and str(ready) in r.stderr


def test_ready_file_is_never_written_through_a_link(tmp_path):
    target, ready = tmp_path / "target", tmp_path / "ready"
    os.symlink(target, ready)
    r = _run(1, ready, str(_free_port()))
    assert r.returncode != 0 and "FileExistsError" in r.stderr
    assert not target.exists()
