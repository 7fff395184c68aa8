"""Issue 35, the weights stage under concurrency and hostile inputs, run as Ansible runs the module (the module file
with an args file, test_model_weights_stage.run) against temp directories and loopback HTTP servers:
two stage runs on one model directory (same manifest, another manifest), a run killed mid-stage (SIGKILL) and its
re-run, a takeover (SIGTERM to the old run's process), a manifest that drops a shard, symlinks in a source and in a
model directory, names the host module must refuse, an S3 listing that fails, a mirror with a truncated file, a 416,
5xx and refused connections. The weights end verified or untouched in every case."""
import hashlib
import http.server
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from test_model_weights_stage import MOD, ROOT, TOKEN, args, make_model, run, serve

from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio

BIG = "model-00001-of-00002.safetensors"
SMALL = "model-00002-of-00002.safetensors"


def start(a, tmp_path):
    """The module in the background (as an async job runs it); .result() waits and parses its JSON."""
    fd, name = tempfile.mkstemp(prefix="args-", suffix=".json", dir=str(tmp_path))
    os.close(fd)
    pathlib.Path(name).write_text(json.dumps({"ANSIBLE_MODULE_ARGS": a}))
    proc = subprocess.Popen([sys.executable, str(MOD), name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, PYTHONPATH=str(ROOT / "collections")))

    def result(timeout=120):
        out, err = proc.communicate(timeout=timeout)
        if not out.strip():
            return {"rc": proc.returncode, "stderr": err}
        res = json.loads(out)
        res.pop("invocation", None)
        return res
    proc.result = result
    return proc


class Slow(http.server.BaseHTTPRequestHandler):
    """A mirror that sends 64 KiB every `delay` s of a shard (a long download to race against), byte ranges as RFC 9110 14.2
    (206 + Content-Range; 416 with `Content-Range: bytes */size` when the first byte is past the end), HEAD with the
    length a GET would send. `fail` maps a path to a list of statuses answered first (503 twice, then the file)."""
    protocol_version = "HTTP/1.1"
    root, delay, fail, head_size = None, 0.05, {}, {}

    def log_message(self, *a):
        pass

    def _file(self):
        return pathlib.Path(self.root) / self.path.lstrip("/")

    def _status(self):
        todo = self.fail.get(self.path.lstrip("/").split("/")[-1]) or []
        if todo:
            code = todo.pop(0)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return True
        return False

    def do_HEAD(self):
        if self._status():
            return
        self.send_response(200)
        name = self.path.lstrip("/").split("/")[-1]
        self.send_header("Content-Length", str(self.head_size.get(name, self._file().stat().st_size)))
        self.end_headers()

    def do_GET(self):
        if self._status():
            return
        data = self._file().read_bytes()
        start = 0
        rng = self.headers.get("Range")
        if rng:
            start = int(rng.split("=", 1)[1].split("-", 1)[0])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        try:
            for off in range(start, len(data), 65536):
                self.wfile.write(data[off:off + 65536])
                self.wfile.flush()
                time.sleep(self.delay if self.path.endswith(".safetensors") else 0)
        except (BrokenPipeError, ConnectionResetError):
            pass


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path)


@pytest.fixture
def slow(model):
    Slow.root, Slow.delay, Slow.fail, Slow.head_size = model["src_root"], 0.05, {}, {}
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield {"type": "http", "url": "http://127.0.0.1:%d" % srv.server_port}
    srv.shutdown()
    srv.server_close()


def final_of(model):
    return model["tmp"] / "dstA" / "org" / "M"


def staging_of(model):
    return model["tmp"] / "dstA" / "org" / (".M" + mw.STAGING_SUFFIX)


def assert_verified(final, files):
    """Every file the marker names is the manifest's (sha256 of the bytes now there), and nothing else is served."""
    marker = json.loads((final / mw.MARKER_NAME).read_text())
    assert marker["manifest_sha256"] == mw.manifest_digest(files)
    for n, f in files.items():
        assert hashlib.sha256((final / n).read_bytes()).hexdigest() == f["sha256"], n
        assert (final / n).stat().st_mode & 0o777 == 0o640
    assert sorted(p.name for p in final.iterdir() if not p.name.startswith(".")) == sorted(files)


def wait_for(cond, timeout=60):
    t0 = time.time()
    while not cond():
        assert time.time() - t0 < timeout, "timed out waiting"
        time.sleep(0.05)


def part_has_bytes(model):
    """The big shard's download has begun (its .part exists: copy_stream fills 8 MiB buffers, so the 3 MiB shard's
    .part stays at 0 bytes until its last byte came - the tester's '0 bytes, mode 0600' file)."""
    return (staging_of(model) / (BIG + mw.PART_SUFFIX)).exists()


# --- two runs on one directory ---------------------------------------------------------------------------------------
def test_a_second_run_with_the_same_manifest_waits_for_the_first_then_finds_it_verified(model, slow):
    a = start(args(model, source=slow, run_id="first"), model["tmp"])
    wait_for(lambda: part_has_bytes(model))
    b = run(args(model, source=slow, run_dir=str(model["tmp"] / "runB"), lock_wait_s=120), model["tmp"])
    ra = a.result()
    assert not ra.get("failed") and ra["models"][0]["result"] == "done", ra.get("msg")
    assert not b.get("failed"), b.get("msg")
    assert b["changed"] is False and b["models"][0]["state"] == "complete" and b["lock_waited_s"] > 0
    assert_verified(final_of(model), model["files"])


def test_a_second_run_is_refused_naming_the_holder_and_the_first_is_untouched(model, slow):
    a = start(args(model, source=slow, run_id="first"), model["tmp"])
    wait_for(lambda: part_has_bytes(model))
    b = run(args(model, source=slow, run_dir=str(model["tmp"] / "runB"), lock_wait_s=1), model["tmp"])
    assert b["failed"]
    assert b["msg"].startswith("A: %s is being staged by another run: pid %d, run first, user " % (
        final_of(model), a.pid)), b["msg"]
    assert "model_weights_takeover=true" in b["msg"] and b["lock_holder"]["pid"] == a.pid
    progress = json.loads((model["tmp"] / "runB" / "progress.json").read_text())
    assert "is being staged by another run (pid %d" % a.pid in progress["waiting_on_lock"]
    ra = a.result()
    assert not ra.get("failed"), ra.get("msg")
    assert_verified(final_of(model), model["files"])


def test_a_second_run_with_another_manifest_waits_then_switches_to_its_own_verified_copy(model, slow):
    a = start(args(model, source=slow), model["tmp"])
    wait_for(lambda: part_has_bytes(model))
    src = pathlib.Path(model["src_root"]) / "org" / "M"
    new_big = os.urandom(3 << 20)
    files2 = dict(model["files"])
    files2[BIG] = {"sha256": hashlib.sha256(new_big).hexdigest(), "size": len(new_big)}
    src2 = model["tmp"] / "src2" / "org" / "M"
    src2.mkdir(parents=True)
    for n in model["files"]:
        (src2 / n).write_bytes(new_big if n == BIG else (src / n).read_bytes())
    b_args = args(model, source={"type": "path", "path": str(model["tmp"] / "src2")},
                  run_dir=str(model["tmp"] / "runB"), lock_wait_s=120)
    b_args["models"][0]["files"] = files2
    b = start(b_args, model["tmp"])
    ra, rb = a.result(), b.result()
    assert not ra.get("failed") and not rb.get("failed"), (ra.get("msg"), rb.get("msg"))
    assert rb["models"][0]["result"] == "done" and rb["lock_waited_s"] > 0
    assert_verified(final_of(model), files2)


def test_a_run_killed_mid_stage_frees_the_lock_and_the_rerun_resumes_to_a_verified_copy(model, slow):
    a = start(args(model, source=slow), model["tmp"])
    wait_for(lambda: part_has_bytes(model))
    os.kill(a.pid, signal.SIGKILL)
    a.wait()
    assert not final_of(model).exists()                       # nothing half is in place
    srv, url = serve(model)
    res = run(args(model, source={"type": "controller", "url": url, "host": "ctl"}, lock_wait_s=5), model["tmp"])
    srv.stop()
    assert not res.get("failed"), res.get("msg")
    assert res["lock_waited_s"] < 2                           # the kernel freed the dead holder's lock
    assert_verified(final_of(model), model["files"])


def test_takeover_ends_the_old_run_by_sigterm_then_stages(model, slow):
    a = start(args(model, source=slow, run_id="old"), model["tmp"])
    wait_for(lambda: part_has_bytes(model))
    srv, url = serve(model)
    res = run(args(model, source={"type": "controller", "url": url, "host": "ctl"}, lock_wait_s=2, takeover=True,
                   run_dir=str(model["tmp"] / "runB")), model["tmp"])
    srv.stop()
    assert a.wait(timeout=30) == 143                          # ended by the takeover's SIGTERM, not raced
    assert not res.get("failed"), res.get("msg")
    assert_verified(final_of(model), model["files"])


def test_an_earlier_runs_server_on_the_port_is_named_or_taken_over(model):
    port = mio_free_port()
    base = {"mode": "serve", "host": "A", "kind": "source", "root": model["src_root"], "bind_address": "127.0.0.1",
            "port": port, "secrets_file": str(model["tmp"] / "secrets.json"),
            "models": [{"rel": "org/M", "final": str(final_of(model)), "files": model["files"]}]}
    old = start(dict(base, run_dir=str(model["tmp"] / "runs" / "old"), max_s=60), model["tmp"])
    lock = model["tmp"] / "runs" / (".serve-%d" % port + mio.LOCK_SUFFIX)
    wait_for(lambda: lock.exists() and '"pid": %d' % old.pid in lock.read_text())
    refused = run(dict(base, run_dir=str(model["tmp"] / "runs" / "new"), max_s=1), model["tmp"])
    assert refused["failed"] and refused["msg"].startswith("A: port %d is served by an earlier run's weights server: "
                                                           "pid %d, run old, " % (port, old.pid)), refused["msg"]
    new = run(dict(base, run_dir=str(model["tmp"] / "runs" / "new"), max_s=1, takeover=True), model["tmp"])
    assert not new.get("failed"), new.get("msg")
    assert old.wait(timeout=30) == -signal.SIGTERM


def test_the_controllers_server_ends_with_the_run_that_started_it(model):
    """A run killed hard (kill -9 of ansible-playbook, a lost controller) runs no cleanup: its controller-side server
    stopped only at max_s (timeout + 300 s: hours) and kept the port and its token (seen 2026-12-06: a helper's killed
    run's server answered the next CI run's stage with 401). With watch_run it stops once that run is gone."""
    from ansible_collections.b300.rollout.plugins.module_utils.common.host_lock import proc_start
    ansible_run = subprocess.Popen(["sleep", "600"])        # stands in for the run's ansible-playbook process
    port = mio_free_port()
    watch = {"pid": ansible_run.pid, "start": proc_start(ansible_run.pid)}
    server = start({"mode": "serve", "host": "controller", "kind": "source", "root": model["src_root"],
                    "bind_address": "127.0.0.1", "port": port, "secrets_file": str(model["tmp"] / "secrets.json"),
                    "run_dir": str(model["tmp"] / "runs" / "r1"), "max_s": 600, "watch_run": watch,
                    "models": [{"rel": "org/M", "final": str(final_of(model)), "files": model["files"]}]},
                   model["tmp"])
    try:
        wait_for(lambda: listening(port) or server.poll() is not None, timeout=30)
        time.sleep(1.5)
        assert server.poll() is None, "the server stopped while its run was alive"
        t0 = time.monotonic()
        ansible_run.kill()
        ansible_run.wait()
        res = server.result(timeout=30)
        assert not res.get("failed"), res
        assert time.monotonic() - t0 < 5, "the server outlived its run by %.1f s" % (time.monotonic() - t0)
        assert not listening(port)
    finally:
        ansible_run.kill()
        server.kill()


def test_a_server_watching_no_run_or_a_reused_pid():
    """No run named: never gone. A live PID whose start time differs (the PID reused by another process): gone."""
    from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_stage as engine
    assert engine.run_gone(None) is False and engine.run_gone({}) is False
    me = {"pid": os.getpid(), "start": engine.hl.proc_start(os.getpid())}
    assert engine.run_gone(me) is False
    assert engine.run_gone(dict(me, start="1")) is True


def listening(port):
    try:
        __import__("socket").create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def mio_free_port():
    s = __import__("socket").socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_the_file_renamed_into_place_is_the_one_hashed():
    with tempfile.TemporaryDirectory() as d:
        part, dest = os.path.join(d, "x.part"), os.path.join(d, "x")
        pathlib.Path(part).write_bytes(b"verified")
        fd = os.open(part, os.O_RDONLY)
        try:
            os.unlink(part)                                      # another writer replaced the path
            pathlib.Path(part).write_bytes(b"other bytes")
            with pytest.raises(mio.IdentityError, match="no longer the file that was hashed"):
                mio.rename_verified(fd, part, dest)
            assert not os.path.exists(dest)
        finally:
            os.close(fd)
        pathlib.Path(part).write_bytes(b"verified")
        fd = os.open(part, os.O_RDONLY)
        mio.rename_verified(fd, part, dest)
        os.close(fd)
        assert pathlib.Path(dest).read_bytes() == b"verified"


def test_the_marker_is_refused_for_a_file_replaced_after_it_was_verified():
    verified = {"a": {"stat": [5, 100, 7]}, "b": {"stat": [9, 200, 8]}}
    assert mw.not_as_verified({"a": [5, 100, 7], "b": [9, 200, 8]}, verified) == []
    assert mw.not_as_verified({"a": [5, 100, 7], "b": [0, 300, 11]}, verified) == ["b"]   # another inode there
    assert mw.not_as_verified({"a": [5, 100, 7], "c": [1, 1, 1]}, verified) == ["c"]      # never verified


# --- a manifest that drops a shard --------------------------------------------------------------------------------
def test_a_manifest_that_drops_a_shard_rebuilds_the_directory_without_it(model):
    run(args(model), model["tmp"])
    final = final_of(model)
    files2 = {n: f for n, f in model["files"].items() if n != SMALL}
    a = args(model)
    a["models"][0]["files"] = files2
    res = run(a, model["tmp"])
    assert not res.get("failed"), res.get("msg")
    m = res["models"][0]
    assert m["result"] == "done" and m["swap"] == "exchange" and res["bytes_fetched"] == 0
    assert any("does not list" in n and SMALL in n for n in res["notes"])
    assert not (final / SMALL).exists()
    assert_verified(final, files2)


# --- symlinks -------------------------------------------------------------------------------------------------------
def test_a_symlink_in_a_path_source_is_refused_naming_link_and_target(model):
    outside = model["tmp"] / "secret.bin"
    src = pathlib.Path(model["src_root"]) / "org" / "M" / SMALL
    outside.write_bytes(src.read_bytes())
    src.unlink()
    src.symlink_to(outside)
    res = run(args(model), model["tmp"])
    assert res["failed"] and "holds 1 of the files org/M needs as symlinks" in res["msg"]
    assert "%s is a symlink to %s" % (src, outside) in res["msg"] and "nothing was written" in res["msg"]
    assert not final_of(model).exists() and not staging_of(model).exists()


def test_the_controllers_server_refuses_a_symlink(model):
    outside = model["tmp"] / "secret.bin"
    outside.write_bytes(b"not a weight")
    link = pathlib.Path(model["src_root"]) / "org" / "M" / "config.json"
    link.unlink()
    link.symlink_to(outside)
    srv, url = serve(model)
    try:
        r = subprocess.run(["curl", "-s", "-H", "Authorization: Bearer " + TOKEN, "-w", "%{http_code}",
                            url + "/v1/files/org/M/config.json"], capture_output=True, text=True, timeout=30)
    finally:
        srv.stop()
    assert r.stdout.endswith("403") and "is a symlink to %s" % outside in r.stdout and "not a weight" not in r.stdout


def test_a_symlink_in_the_model_directory_is_replaced_and_its_target_never_chowned(model):
    run(args(model), model["tmp"])
    final = final_of(model)
    outside = model["tmp"] / "outside.bin"
    outside.write_bytes((final / SMALL).read_bytes())
    os.chmod(outside, 0o600)
    (final / SMALL).unlink()
    (final / SMALL).symlink_to(outside)
    res = run(args(model), model["tmp"])
    assert not res.get("failed"), res.get("msg")
    assert oct(outside.stat().st_mode & 0o777) == "0o600"      # never chmodded/chowned through the link
    assert not (final / SMALL).is_symlink()
    assert_verified(final, model["files"])


def test_the_controllers_plan_refuses_a_symlink_in_its_path_source(model):
    outside = model["tmp"] / "secret.bin"
    link = pathlib.Path(model["src_root"]) / "org" / "M" / "config.json"
    outside.write_bytes(link.read_bytes())
    link.unlink()
    link.symlink_to(outside)
    a = dict(args(model)["models"][0], digest=mw.manifest_digest(model["files"]))   # as step models hands it on
    plan_args = {"step": "fanout", "models": {"A": [a]}, "states": {"A": [{"rel": "org/M", "state": "absent"}]},
                 "source": {"type": "path", "where": "controller", "path": model["src_root"]},
                 "serve_addresses": {"A": "127.0.0.1"}, "controller_address": "127.0.0.1"}
    f = model["tmp"] / "plan-args.json"
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": plan_args}))
    r = subprocess.run([sys.executable, str(MOD.parent / "model_weights_plan.py"), str(f)], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, PYTHONPATH=str(ROOT / "collections")))
    assert r.stdout.strip(), r.stderr[-3000:]
    res = json.loads(r.stdout)
    assert res["failed"] and ("controller: the source %s holds org/M/config.json through a symlink: %s is a symlink "
                              "to %s (manifest m.json); nothing was written" % (model["src_root"], link, outside)
                              ) in res["msg"], res["msg"]


def test_weights_manifest_refuses_a_symlink(tmp_path):
    d = tmp_path / "M"
    d.mkdir()
    (d / "config.json").write_text("{}")
    (tmp_path / "elsewhere.safetensors").write_bytes(b"x")
    (d / "model.safetensors").symlink_to(tmp_path / "elsewhere.safetensors")
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "weights-manifest"), str(d)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stdout == ""
    assert "%s is a symlink to %s" % (d / "model.safetensors", tmp_path / "elsewhere.safetensors") in r.stderr


@pytest.mark.parametrize("name", ["../escape.safetensors", "/etc/passwd", "a\x00b", "sub/../../x"])
def test_the_host_module_refuses_a_name_that_leaves_the_model_directory(model, name):
    a = args(model)
    a["models"][0]["files"] = dict(model["files"], **{name: {"sha256": "0" * 64, "size": 1}})
    res = run(a, model["tmp"])
    assert res["failed"] and res["msg"].startswith("A: org/M: file name %r in its manifest (m.json): " % name)
    assert not (model["tmp"] / "dstA").exists()


# --- sources ----------------------------------------------------------------------------------------------------------
# A stand-in rclone: what the real one prints when a key is wrong (rclone's log line format "<date> <time> ERROR :
# <msg>", rclone docs "Logging"; the S3 error code InvalidAccessKeyId and its text from the S3 API reference, "Error
# responses"), then exits 1 as the real one does when a command fails (its main() exits 1 for an error it does not
# categorise). The secret is echoed to show that the module removes it from what it reports.
FAKE_RCLONE = """#!/bin/sh
echo "2026/12/06 04:50:00 ERROR : : error listing: InvalidAccessKeyId: The AWS Access Key Id you provided does not \
exist in our records. key=$RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY" >&2
echo "2026/12/06 04:50:00 Failed to lsjson: error in ListJSON: InvalidAccessKeyId: The AWS Access Key Id you \
provided does not exist in our records." >&2
exit 1
"""


def test_an_s3_listing_failure_is_a_clear_per_host_message_without_the_secret(model, monkeypatch):
    bindir = model["tmp"] / "bin"
    bindir.mkdir()
    (bindir / "rclone").write_text(FAKE_RCLONE)
    (bindir / "rclone").chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (bindir, os.environ["PATH"]))
    (model["tmp"] / "secrets.json").write_text(json.dumps({"peer_token": TOKEN, "s3_access_key_id": "AKIAEXAMPLE",
                                                           "s3_secret_access_key": "s3cr3t-value"}))
    res = run(args(model, source={"type": "s3", "endpoint": "http://127.0.0.1:9", "bucket": "weights",
                                  "prefix": "p"}), model["tmp"])
    assert res["failed"] and "Traceback" not in json.dumps(res)
    assert res["msg"].startswith("A: the source (s3 http://127.0.0.1:9 bucket weights) could not be listed, so none "
                                 "of the files org/M needs was checked: listing src:weights/p/org/M failed: rclone "
                                 "lsjson src:weights/p/org/M exited 1: "), res["msg"]
    assert "InvalidAccessKeyId" in res["msg"] and "s3cr3t-value" not in json.dumps(res) and "<redacted>" in res["msg"]
    assert "nothing was written; fix: " in res["msg"] and not staging_of(model).exists()


def test_a_truncated_file_at_the_mirror_is_refused_before_the_first_byte(model, slow):
    p = pathlib.Path(model["src_root"]) / "org" / "M" / SMALL
    p.write_bytes(p.read_bytes()[:1000])
    res = run(args(model, source=slow), model["tmp"])
    assert res["failed"] and "holds 1 of the files org/M needs with another size" in res["msg"]
    assert "%s (found: 1000 bytes at the source (Content-Length)" % SMALL in res["msg"]
    assert res.get("bytes_fetched", 0) == 0 and not staging_of(model).exists()


def test_a_416_names_the_short_source_and_promises_no_resume(model, slow):
    p = pathlib.Path(model["src_root"]) / "org" / "M" / BIG
    whole = p.read_bytes()
    p.write_bytes(whole[:512 << 10])                          # the mirror's copy shrank after its HEAD answered
    Slow.head_size = {BIG: len(whole)}
    staging = staging_of(model)
    staging.mkdir(parents=True)
    (staging / (BIG + mw.PART_SUFFIX)).write_bytes(whole[:1 << 20])
    (staging / mw.STAGING_STATE).write_text(json.dumps({"manifest_sha256": "x", "verified": {},
                                                        "parts": {BIG: model["files"][BIG]["sha256"]}}))
    res = run(args(model, source=slow), model["tmp"])
    assert res["failed"]
    msg = next(e for e in res["errors"] if BIG in e)
    assert "(HTTP 416)" in msg and "the source holds fewer bytes than the manifest's %d" % len(whole) in msg
    assert "a re-run cannot finish it" in msg and "a re-run resumes there" not in msg
    assert not final_of(model).exists()


def test_a_5xx_is_retried_with_backoff_then_succeeds(model, slow):
    Slow.fail = {SMALL: [503, 503], "config.json": [502]}
    res = run(args(model, source=slow, retries=3, retry_delay_s=0.1), model["tmp"])
    assert not res.get("failed"), res.get("msg")
    assert_verified(final_of(model), model["files"])


def test_a_5xx_that_lasts_is_named_a_server_error_not_a_missing_file(model, slow):
    Slow.fail = {SMALL: [503] * 10}
    res = run(args(model, source=slow, retries=2, retry_delay_s=0.05), model["tmp"])
    assert res["failed"] and "answered with a server error (HTTP 5xx) for 1 of the files" in res["msg"]
    assert "(HTTP 503)" in res["msg"] and "lacks" not in res["msg"] and Slow.fail[SMALL] == [503] * 7


def test_a_refused_connection_is_named_as_such(model):
    port = mio_free_port()                                    # nothing listens there
    res = run(args(model, source={"type": "http", "url": "http://127.0.0.1:%d" % port}, retries=1,
                   retry_delay_s=0.05), model["tmp"])
    assert res["failed"] and "did not answer for 5 of the files org/M needs after the retries" in res["msg"]
    assert "exited 7" in res["msg"] and "lacks" not in res["msg"]


def test_backoff_delays_are_bounded():
    assert mio.backoff_delays(5, 2, 5) == [2, 4, 5, 5, 5]
    assert mio.backoff_delays(0, 2, 5) == []
    assert mio.classify_failure(7, None) == ("network", True)
    assert mio.classify_failure(22, 503) == ("server", True)
    assert mio.classify_failure(22, 404) == ("missing", False)
    assert mio.classify_failure(22, 416) == ("short", False)
    assert mio.classify_rclone(5) == ("network", True) and mio.classify_rclone(7) == ("other", False)
    assert mio.classify_rclone(4) == ("missing", False)
    line = mw.progress_line("A", {"waiting_on_lock": "A: /m/M is being staged by another run (pid 7, ...)"})
    assert line == "A: /m/M is being staged by another run (pid 7, ...)"
    assert mio.head_content_length("HTTP/1.1 302 Found\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\n"
                                   "Content-Length: 123\r\n\r\n") == 123
