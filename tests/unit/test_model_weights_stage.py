"""The host module model_weights_stage run as Ansible runs it (the module file with an args file), on this machine:
a path source, the byte-range server (kind source) with curl, a server that ignores ranges (the stdlib
http.server, which answers 200 to a Range: the restart-from-0 branch), a source that dies mid-file, wrong bytes at
the source, a file the source lacks, too little space, the two-host chain (a peer serving what it verified).
Everything under tmp_path, servers on free loopback ports."""
import hashlib
import http.server
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio

ROOT = pathlib.Path(__file__).resolve().parents[2]
MOD = ROOT / "collections/ansible_collections/b300/rollout/plugins/modules/model_weights_stage.py"
TOKEN = "t" * 40
pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is needed for the HTTP cases")


def run(args, tmp_path):
    # a name of its own: the chain test runs two at once, and a count of the files there gave both the same name
    # (the second host's arguments overwrote the first's, both ran as one host and waited on each other)
    fd, name = tempfile.mkstemp(prefix="args-", suffix=".json", dir=str(tmp_path))
    os.close(fd)
    f = pathlib.Path(name)
    f.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    r = subprocess.run([sys.executable, str(MOD), str(f)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT / "collections")))
    assert r.stdout.strip(), "module printed nothing (rc %s): %s" % (r.returncode, r.stderr[-3000:])
    res = json.loads(r.stdout)
    res.pop("invocation", None)
    return res


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def model(tmp_path):
    return make_model(tmp_path)


def make_model(tmp_path):
    """A model of real shape, small: an index, two shards, config, tokenizer (random, incompressible bytes)."""
    src = tmp_path / "src" / "org" / "M"
    src.mkdir(parents=True)
    sizes = {"config.json": 40, "tokenizer.json": 70, "model.safetensors.index.json": 90,
             "model-00001-of-00002.safetensors": 3 << 20, "model-00002-of-00002.safetensors": (2 << 20) + 7}
    files = {}
    for n, s in sizes.items():
        b = os.urandom(s)
        (src / n).write_bytes(b)
        files[n] = {"sha256": hashlib.sha256(b).hexdigest(), "size": s}
    (tmp_path / "secrets.json").write_text(json.dumps({"peer_token": TOKEN}))
    return {"tmp": tmp_path, "src_root": str(tmp_path / "src"), "files": files}


def args(model, host="A", source=None, final=None, **kw):
    t = model["tmp"]
    a = {"mode": "stage", "host": host, "group": "root", "run_dir": str(t / ("run" + host)), "parallel": 2,
         "retries": 1, "stall_s": 5, "secrets_file": str(t / "secrets.json"),
         "models": [{"rel": "org/M", "final": final or str(t / ("dst" + host) / "org" / "M"), "need": "full",
                     "files": model["files"], "where": "m.json",
                     "source": source or {"type": "path", "path": model["src_root"]}}]}
    a.update(kw)
    return a


def serve(model, kind="source", **kw):
    port = free_port()
    files = model["files"]
    if kind == "source":
        models = [{"rel": "org/M", "names": set(files), "root": model["src_root"]}]
    else:
        final = kw["final"]
        models = [{"rel": "org/M", "names": set(files), "digest": mw.manifest_digest(files), "final": final,
                   "staging": os.path.join(os.path.dirname(final), ".M" + mw.STAGING_SUFFIX),
                   "status_name": mw.status_name("org/M")}]
    srv = mio.WeightsServer("127.0.0.1", port, TOKEN, models, kind=kind, run_dir=kw.get("run_dir"))
    srv.start()
    return srv, "http://127.0.0.1:%d" % port


def test_cold_stage_then_a_no_change_run_reads_no_weight_byte(model):
    res = run(args(model), model["tmp"])
    assert not res.get("failed"), res.get("msg")
    m = res["models"][0]
    assert m["result"] == "done" and m["swap"] == "rename" and res["bytes_fetched"] == mw.total_bytes(model["files"])
    final = pathlib.Path(m["final"])
    for n, f in model["files"].items():
        assert hashlib.sha256((final / n).read_bytes()).hexdigest() == f["sha256"]
        assert oct((final / n).stat().st_mode & 0o777) == "0o640"
    assert oct(final.stat().st_mode & 0o777) == "0o750"
    assert json.loads((final / mw.MANIFEST_NAME).read_text()) == {"files": model["files"]}
    assert not (final.parent / (".M" + mw.STAGING_SUFFIX)).exists()
    # no change: stat only, nothing written, no weight byte read, the run directory not even created
    again = run(args(model, run_dir=str(model["tmp"] / "run2")), model["tmp"])
    assert again["changed"] is False and again["models"][0]["state"] == "complete"
    assert again["weight_bytes_read"] == 0 and again["io"]["rchar"] < 200000 and again["io"]["write_bytes"] == 0
    assert not (model["tmp"] / "run2").exists()


def test_a_lost_shard_is_fetched_alone_the_rest_linked_and_the_directory_exchanged(model):
    run(args(model), model["tmp"])
    final = model["tmp"] / "dstA" / "org" / "M"
    kept_ino = (final / "model-00001-of-00002.safetensors").stat().st_ino
    (final / "model-00002-of-00002.safetensors").unlink()
    res = run(args(model), model["tmp"])
    m = res["models"][0]
    assert m["result"] == "done" and m["swap"] == "exchange" and m["actions"] == {"fetch": 1, "link": 4}
    assert res["bytes_fetched"] == model["files"]["model-00002-of-00002.safetensors"]["size"]
    assert (final / "model-00001-of-00002.safetensors").stat().st_ino == kept_ino   # linked, not copied
    assert run(args(model), model["tmp"])["models"][0]["state"] == "complete"       # marker valid after the swap


def test_a_hand_copied_directory_is_adopted_in_place_by_hashing_it_once(model):
    final = model["tmp"] / "dstA" / "org" / "M"
    shutil.copytree(pathlib.Path(model["src_root"]) / "org" / "M", final)
    res = run(args(model, source={"type": "none"}), model["tmp"])
    assert res["models"][0]["result"] == "adopted" and res["models"][0]["swap"] == "in-place"
    assert res["weight_bytes_read"] == mw.total_bytes(model["files"]) and res["bytes_fetched"] == 0
    assert (final / mw.MARKER_NAME).exists()


def test_resume_from_a_part_over_http_ranges_and_restart_where_ranges_are_ignored(model):
    srv, url = serve(model)
    staging = model["tmp"] / "dstA" / "org" / (".M" + mw.STAGING_SUFFIX)
    staging.mkdir(parents=True)
    name = "model-00001-of-00002.safetensors"
    whole = (pathlib.Path(model["src_root"]) / "org" / "M" / name).read_bytes()
    (staging / (name + ".part")).write_bytes(whole[:1 << 20])
    (staging / mw.STAGING_STATE).write_text(json.dumps({"manifest_sha256": "x", "verified": {},
                                                        "parts": {name: model["files"][name]["sha256"]}}))
    res = run(args(model, source={"type": "controller", "url": url, "host": "ctl"}), model["tmp"])
    srv.stop()
    assert not res.get("failed"), res.get("msg")
    total = mw.total_bytes(model["files"])
    assert res["bytes_fetched"] == total - (1 << 20)          # the prefix was re-hashed, not fetched again
    assert res["weight_bytes_read"] == 1 << 20
    # the same .part against a server that answers 200 to a Range (python -m http.server): curl exits 33, the file
    # restarts from its first byte instead of appending a second copy of its start
    shutil.rmtree(model["tmp"] / "dstA")
    staging.mkdir(parents=True)
    (staging / (name + ".part")).write_bytes(whole[:1 << 20])
    (staging / mw.STAGING_STATE).write_text(json.dumps({"manifest_sha256": "x", "verified": {},
                                                        "parts": {name: model["files"][name]["sha256"]}}))
    def handler(*a, **k):
        return http.server.SimpleHTTPRequestHandler(*a, directory=model["src_root"], **k)
    plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=plain.serve_forever, daemon=True).start()
    try:
        res = run(args(model, source={"type": "http", "url": "http://127.0.0.1:%d" % plain.server_port}), model["tmp"])
    finally:
        plain.shutdown()
    assert not res.get("failed"), res.get("msg")
    assert res["bytes_fetched"] == total and res["models"][0]["result"] == "done"


class CutServer(http.server.BaseHTTPRequestHandler):
    """A mirror that dies mid-file: sends `cut` bytes of the big shard, then closes the connection; every later
    request is refused (as a mirror process that was killed)."""
    protocol_version = "HTTP/1.1"
    root = cut = None
    served = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        CutServer.served.append((self.path, self.headers.get("Range")))
        data = (pathlib.Path(self.root) / self.path.lstrip("/")).read_bytes()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if "model-00001" in self.path:
            self.wfile.write(data[:self.cut])
            self.wfile.flush()
            self.server.dead = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data)

    def do_HEAD(self):
        # what a mirror answers to HEAD (RFC 9110 9.3.2): the Content-Length a GET would send, no body; the
        # pre-check compares it with the manifest's size before the first byte
        self.send_response(200)
        self.send_header("Content-Length", str((pathlib.Path(self.root) / self.path.lstrip("/")).stat().st_size))
        self.end_headers()


def test_a_source_that_dies_mid_copy_fails_clearly_keeps_the_part_and_the_rerun_resumes(model):
    CutServer.root, CutServer.cut, CutServer.served = model["src_root"], 1 << 20, []

    class Dying(http.server.HTTPServer):
        dead = False

        def verify_request(self, request, client_address):
            return not self.dead
    srv = Dying(("127.0.0.1", 0), CutServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = "http://127.0.0.1:%d" % srv.server_port
    res = run(args(model, source={"type": "http", "url": url}, retries=1), model["tmp"])
    srv.shutdown()
    srv.server_close()
    assert res["failed"]
    name = "model-00001-of-00002.safetensors"
    msg = next(e for e in res["errors"] if e.startswith("A: org/M/%s from %s: curl " % (name, url)))
    assert "kept in" in msg and "a re-run resumes there" in msg and "the serving copy is untouched" in msg
    assert "expected %d bytes, sha256 %s" % (3 << 20, model["files"][name]["sha256"]) in msg
    part = model["tmp"] / "dstA" / "org" / (".M" + mw.STAGING_SUFFIX) / (name + ".part")
    assert part.stat().st_size == 1 << 20                   # what arrived is kept
    assert not (model["tmp"] / "dstA" / "org" / "M").exists()   # nothing half is in place
    # the mirror is back (range-capable): what was verified stays, the .part resumes, the rest is fetched
    done = json.loads((part.parent / mw.STAGING_STATE).read_text())["verified"]
    srv2, url2 = serve(model)
    res = run(args(model, source={"type": "controller", "url": url2, "host": "ctl"}), model["tmp"])
    srv2.stop()
    assert not res.get("failed"), res.get("msg")
    assert res["bytes_fetched"] == mw.total_bytes(model["files"]) - (1 << 20) - sum(f["size"] for f in done.values())


def test_wrong_bytes_at_the_source_rejected_never_served_serving_copy_untouched(model):
    run(args(model), model["tmp"])
    final = model["tmp"] / "dstA" / "org" / "M"
    name = "model-00002-of-00002.safetensors"
    before = {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in final.iterdir()}
    bad = bytearray((pathlib.Path(model["src_root"]) / "org" / "M" / name).read_bytes())
    bad[4096] ^= 0xFF
    (pathlib.Path(model["src_root"]) / "org" / "M" / name).write_bytes(bad)
    files = dict(model["files"])
    files["config.json"] = {"sha256": hashlib.sha256(b"new").hexdigest(), "size": 3}   # a new revision ...
    (pathlib.Path(model["src_root"]) / "org" / "M" / "config.json").write_bytes(b"new")
    files[name] = dict(files[name])
    a = args(model)
    a["models"][0]["files"] = files
    (final / name).unlink()                                                           # ... and a lost shard
    before.pop(name)
    res = run(a, model["tmp"])
    assert res["failed"]
    assert ("A: org/M/%s from path %s: found sha256 %s, %d bytes; expected sha256 %s, %d bytes (manifest m.json)"
            % (name, model["src_root"], hashlib.sha256(bad).hexdigest(), len(bad), files[name]["sha256"],
               files[name]["size"])) in res["msg"]
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in final.iterdir()} == before
    staging = final.parent / (".M" + mw.STAGING_SUFFIX)
    assert not (staging / name).exists() and not (staging / (name + ".part")).exists()


def test_a_file_the_source_lacks_and_too_little_space_are_refused_before_the_first_byte(model):
    os.unlink(os.path.join(model["src_root"], "org", "M", "tokenizer.json"))
    res = run(args(model), model["tmp"])
    assert res["failed"] and res["msg"].startswith("A: the source (path %s) lacks 1 of the files org/M needs: "
                                                   "tokenizer.json (found: not found (%s/org/M/tokenizer.json); "
                                                   "expected 70 bytes, sha256 %s); nothing was written"
                                                   % (model["src_root"], model["src_root"],
                                                      model["files"]["tokenizer.json"]["sha256"]))
    assert not (model["tmp"] / "dstA" / "org" / (".M" + mw.STAGING_SUFFIX)).exists()
    res = run(args(model, reserve_bytes=1 << 60), model["tmp"])
    assert res["failed"] and "A: not enough free space on " in res["msg"] and "short by" in res["msg"]
    # nothing but the directory lock of the first run (kept for good beside the model directory: mio.DirLock)
    assert [p.name for p in (model["tmp"] / "dstA" / "org").iterdir()] == [".M" + mio.LOCK_SUFFIX]


def test_protect_home_refused(model):
    res = run(args(model, final="/home/x/models/org/M"), model["tmp"])
    assert res["failed"] and "is under /home, which the units' ProtectHome= hides" in res["msg"]


def test_the_chain_the_second_host_pulls_each_file_from_the_first_as_it_is_verified(model):
    ctl, ctl_url = serve(model)
    fa = str(model["tmp"] / "dstA" / "org" / "M")
    os.makedirs(model["tmp"] / "runA", exist_ok=True)
    peer, peer_url = serve(model, kind="staged", final=fa, run_dir=str(model["tmp"] / "runA"))
    # B waits on A's verified files: a loaded machine (two cores, other tests beside) can stall a read past the 5 s
    # of args(), and B would fall back to the controller; the chain itself is what is tested here
    b_args = args(model, host="B", source={"type": "peer", "url": peer_url, "host": "A"}, stall_s=60)
    b_args["models"][0]["fallback"] = {"type": "controller", "url": ctl_url, "host": "ctl"}
    out = {}
    tb = threading.Thread(target=lambda: out.__setitem__("B", run(b_args, model["tmp"])))
    tb.start()
    out["A"] = run(args(model, source={"type": "controller", "url": ctl_url, "host": "ctl"}), model["tmp"])
    tb.join()
    ctl.stop()
    peer.stop()
    total = mw.total_bytes(model["files"])
    assert not out["A"].get("failed") and not out["B"].get("failed"), (out["A"].get("msg"), out["B"].get("msg"))
    assert ctl.stats()["org/M"]["bytes"] == total             # the source sent each byte once
    assert peer.stats()["org/M"]["bytes"] == total            # B got every byte from A
    assert out["B"]["notes"] == []
    # a wrong token is refused
    assert peer.stats().get("-", {}).get("refused", 0) == 0
