"""The weights stage on the sandbox (issue 28): playbooks/weights.yml over SSH like production, the kimi_k3 profile's
two directories (moonshotai/Kimi-K3 and its draft RadixArk/Kimi-K3-DSpark) under a test model root /srv/wtest/models
(not the stub's), small generated models of real shape (an index, safetensors shards, config, tokenizer; a few MB so
the module stays fast). One module-scoped setup; the cases run in file order and each leaves both hosts complete.

Sources and their doubles (what real behaviour each copies):
  * the controller path source with a space in its path: the stage's own byte-range server on the controller;
  * an HTTP mirror that dies mid-file (RangeMirror below: RFC 7233 ranges as nginx serves static files - 206 with
    Content-Range for `Range: bytes=N-`; with `cut` it sends N bytes of one file, then closes and refuses every later
    connection, as a mirror process that was killed);
  * an S3-compatible store: moto's own server (moto[server] 5.2.5, tools/weights-s3-venv.sh), bound to the sandbox
    gateway, accessed by rclone on the host with the credentials in its environment.
Every failure names host, file, found and expected and leaves the serving copy as it was (same inodes, same marker).
"""
import hashlib
import http.server
import json
import os
import pathlib
import re
import socket
import subprocess
import threading
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.sandbox, pytest.mark.integration]
GATEWAY = "10.89.30.1"
HOST_ROOT = "/srv/wtest/models"
BIG, DRAFT = "moonshotai/Kimi-K3", "RadixArk/Kimi-K3-DSpark"
WATCH = ROOT / "tools/bench/inotify_watch.py"


def make_model(d, shards):
    d.mkdir(parents=True, exist_ok=True)
    wm = {}
    for i, size in enumerate(shards, 1):
        name = "model-%05d-of-%05d.safetensors" % (i, len(shards))
        (d / name).write_bytes(os.urandom(size))
        wm["w%d" % i] = name
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": sum(shards) - 0},
                                                                "weight_map": wm}))
    (d / "config.json").write_text('{"model_type": "test"}')
    (d / "tokenizer.json").write_text('{"version": "1.0"}')


def manifest_of(d):
    return {p.name: {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "size": p.stat().st_size}
            for p in sorted(d.iterdir()) if p.is_file()}


def write_manifest(mdir, rel, files):
    p = mdir / (rel + ".json")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps({"files": files}, indent=2, sort_keys=True))


class Env:
    def __init__(self, sandbox, tmp):
        self.sb, self.tmp = sandbox, tmp
        self.src = tmp / "model store" / "models"          # a source path with a space
        make_model(self.src / BIG, [3 << 20, 2 << 20, (1 << 20) + 13])
        make_model(self.src / DRAFT, [512 << 10])
        self.files = {BIG: manifest_of(self.src / BIG), DRAFT: manifest_of(self.src / DRAFT)}
        self.man = tmp / "manifests"
        for rel, f in self.files.items():
            write_manifest(self.man, rel, f)
        self.total = sum(f["size"] for m in self.files.values() for f in m.values())

    def extra(self, **kw):
        e = {"sglang_model_root": HOST_ROOT, "model_weights_manifest_dir": str(self.man),
             "model_weights_source": {"type": "path", "where": "controller", "path": str(self.src)},
             "model_weights_progress_s": 2, "model_weights_retries": 1, "model_weights_stall_s": 5,
             "model_weights_parallel_files": 2}
        e.update(kw)
        return e

    def play(self, limit="b300a,b300b", ok=True, vars_file=None, **kw):
        """playbooks/weights.yml with the json callback; (rc, {task name: {host: result}}, plain text of it all)."""
        argv = ["ansible-playbook", "playbooks/weights.yml", "-i", self.sb.inventory, "-l", limit,
                "-e", json.dumps(self.extra(**kw))]
        if vars_file:
            argv += ["-e", "@%s" % vars_file]
        env = dict(self.sb.env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
        r = self.sb.run(argv, check=False, env=env, timeout=600)
        doc = json.loads(r.stdout[r.stdout.index("{"):])
        tasks = {}
        for play in doc["plays"]:
            for t in play["tasks"]:
                # the json callback names a role's task "<role> : <name>"
                tasks.setdefault(t["task"]["name"].split(" : ", 1)[-1], {}).update(t["hosts"])
        if ok:
            assert r.returncode == 0, "weights.yml failed: %s" % failures(tasks)
        return r.returncode, tasks, r.stdout

    def host_files(self, host, rel):
        """{name: (sha256, size, owner, group, mode, inode)} of a staged directory on the host."""
        out = self.sb.exec(host, "cd '%s/%s' && for f in * .b300-stage.json; do printf '%%s %%s ' \"$f\" "
                                 "\"$(sha256sum < \"$f\" | cut -c1-64)\"; stat -c '%%s %%U %%G %%a %%i' \"$f\"; done; "
                                 "stat -c 'DIR %%U %%G %%a' ." % (HOST_ROOT, rel)).stdout
        res = {}
        for line in out.splitlines():
            w = line.split()
            res[w[0]] = tuple(w[1:])
        return res


def failures(tasks):
    return {name: {h: (r.get("msg") or r.get("assertion")) for h, r in hosts.items() if r.get("failed")}
            for name, hosts in tasks.items() if any(r.get("failed") for r in hosts.values())}


def msgs(tasks):
    return " || ".join(str(r.get("msg") or "") for hosts in tasks.values() for r in hosts.values())


def stage_result(tasks, host):
    res = [r for r in [tasks.get("Stage | stage job state", {}).get(host)] if r]
    return res[0] if res else None


@pytest.fixture(scope="module")
def env(sandbox, tmp_path_factory):
    e = Env(sandbox, tmp_path_factory.mktemp("weights"))
    for h in ("b300a", "b300b"):
        sandbox.exec(h, "rm -rf /srv/wtest /srv/wtiny; mkdir -p /srv")
    yield e
    for h in ("b300a", "b300b"):
        sandbox.exec(h, "umount /srv/wtiny 2>/dev/null; rm -rf /srv/wtest /srv/wtiny", check=False)


# --- 1. cold stage to both hosts (b300b from b300a), then a no-change run ------------------------------------------------
def test_cold_stage_fanout_then_no_change_reads_no_weight_byte(env, sandbox):
    t0 = time.time()
    _rc, tasks, out = env.play()
    cold = time.time() - t0
    for h in ("b300a", "b300b"):
        for rel, files in env.files.items():
            got = env.host_files(h, rel)
            for name, f in files.items():
                sha, size, owner, group, mode, _ino = got[name]
                assert (sha, int(size), owner, group, mode) == (f["sha256"], f["size"], "root", "sglang", "640"), (h, name)
            assert got["DIR"] == ("root", "sglang", "750") and ".b300-stage.json" in got
    # the source sent each byte once: the controller's server to b300a, b300a's server to b300b
    ctl = tasks["Cleanup | the controller's server ended"]
    served = next(iter(ctl.values()))["served"]
    assert sum(v["bytes"] for k, v in served.items() if k != "-") == env.total
    assert sum(v["bytes"] for v in tasks["Cleanup | this host's server ended"]["b300a"]["served"].values()) == env.total
    assert stage_result(tasks, "b300b")["models"][0]["sources"][0].startswith("peer b300a")
    # progress lines and the summary per host
    assert re.search(r"b300[ab]: .* of .* \(\d+%\) at .*/s, ETA .*; files \d+/\d+; from ", out), out[-3000:]
    assert "b300b: %s/%s done: 6 files" % (HOST_ROOT, BIG) in out
    # no change: stat only, 0 weight bytes read (the module's own count, and the kernel's: inotify on the hosts)
    for h in ("b300a", "b300b"):
        sandbox.run(["podman", "cp", str(WATCH), "b300-%s:/tmp/inotify_watch.py" % h])
        sandbox.run(["podman", "exec", "-d", "b300-" + h, "python3", "/tmp/inotify_watch.py", "/srv/wtest",
                     "/tmp/wtest-inotify.json"])
        sandbox.exec(h, "for i in $(seq 50); do [ -f /tmp/wtest-inotify.json.ready ] && break; sleep 0.1; done")
    t0 = time.time()
    _rc, tasks, out = env.play()
    rerun = time.time() - t0
    events = {}
    for h in ("b300a", "b300b"):
        sandbox.exec(h, "pkill -TERM -f '^python3 /tmp/inotify_watch.py'; for i in $(seq 50); do "
                        "[ -s /tmp/wtest-inotify.json ] && break; sleep 0.1; done")
        events[h] = json.loads(sandbox.exec(h, "cat /tmp/wtest-inotify.json; rm -f /tmp/wtest-inotify.json*").stdout)
    for h, r in tasks["Weights | what each model directory holds (marker + one stat per file; no weight byte read)"].items():
        assert r["weight_bytes_read"] == 0 and r["io"]["write_bytes"] == 0, (h, r["io"])
        assert {m["state"] for m in r["models"]} == {"complete"}
    for h, ev in events.items():
        touched = {k: n for kind in ("open", "access") for k, n in ev[kind].items() if k.endswith(".safetensors")}
        assert touched == {}, "%s: weight files opened or read during a no-change run: %s" % (h, touched)
    assert "Stage | stage job state" not in tasks                # nothing staged, no server started
    assert "b300a: checked by marker and 10 stats" in out and "0 weight bytes read" in out
    print("weights: cold fan-out %.1f s, no-change run %.1f s" % (cold, rerun))


# --- 2. a host that lost its copy pulls from the one that holds it -----------------------------------------------------
def test_a_host_that_lost_its_copy_is_restaged_from_its_peer_not_the_source(env, sandbox):
    shard = "model-00002-of-00003.safetensors"
    sandbox.exec("b300b", "rm '%s/%s/%s'; echo x >> '%s/%s/config.json'" % (HOST_ROOT, BIG, shard, HOST_ROOT, BIG))
    _rc, tasks, out = env.play()
    r = stage_result(tasks, "b300b")
    m = next(x for x in r["models"] if x["rel"] == BIG)
    assert m["result"] == "done" and m["swap"] == "exchange"
    assert m["actions"] == {"fetch": 2, "link": 4}                 # the lost shard and the changed config, nothing else
    want = env.files[BIG][shard]["size"] + env.files[BIG]["config.json"]["size"]
    assert r["bytes_fetched"] == want
    served = next(iter(tasks["Cleanup | the controller's server ended"].values()))["served"]
    assert sum(v["bytes"] for k, v in served.items() if k != "-") == 0          # the source was not read
    assert env.host_files("b300b", BIG)[shard][0] == env.files[BIG][shard]["sha256"]


# --- 3. a source that dies mid-copy -------------------------------------------------------------------------------------
class RangeMirror(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    root = None
    cut = None          # (name, bytes): send that many bytes of that file, then die

    def log_message(self, *a):
        pass

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        p = self.root / self.path.lstrip("/").replace("%20", " ")
        if not p.is_file():
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        data = p.read_bytes()
        start = 0
        m = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
        if m:
            start = int(m.group(1))
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        if head:
            return
        if self.cut and p.name == self.cut[0]:
            self.wfile.write(data[start:start + self.cut[1]])
            self.wfile.flush()
            self.server.dead = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.wfile.write(data[start:])


class Mirror(http.server.ThreadingHTTPServer):
    daemon_threads = True
    dead = False

    def verify_request(self, request, client_address):
        return not self.dead


def mirror(root, cut=None):
    handler = type("H", (RangeMirror,), {"root": root, "cut": cut})
    srv = Mirror((GATEWAY, 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, "http://%s:%d" % (GATEWAY, srv.server_port)


def test_a_source_that_dies_mid_copy_fails_clearly_and_the_rerun_resumes(env, sandbox):
    sandbox.exec("b300a", "rm -rf '%s'" % HOST_ROOT)
    shard = "model-00001-of-00003.safetensors"
    srv, url = mirror(env.src, cut=(shard, 1 << 20))
    try:
        rc, tasks, _out = env.play(limit="b300a", ok=False, model_weights_source={"type": "http", "url": url})
    finally:
        srv.shutdown()
        srv.server_close()
    assert rc != 0
    errors = stage_result(tasks, "b300a")["errors"]
    err = next(e for e in errors if e.startswith("b300a: %s/%s from %s: curl " % (BIG, shard, url)))
    assert "expected %d bytes, sha256 %s" % (env.files[BIG][shard]["size"], env.files[BIG][shard]["sha256"]) in err
    assert "kept in" in err and "the serving copy is untouched" in err
    assert sandbox.exec("b300a", "test -d '%s/%s'" % (HOST_ROOT, BIG), check=False).returncode != 0   # nothing half
    part = sandbox.exec("b300a", "stat -c %%s '%s/moonshotai/.Kimi-K3.b300-staging/%s.part'" % (HOST_ROOT, shard))
    assert int(part.stdout) == 1 << 20
    srv, url = mirror(env.src)
    try:
        _rc, tasks, _out = env.play(limit="b300a", model_weights_source={"type": "http", "url": url})
    finally:
        srv.shutdown()
        srv.server_close()
    r = stage_result(tasks, "b300a")
    assert r["weight_bytes_read"] >= 1 << 20                      # the .part's prefix re-hashed once
    assert r["bytes_fetched"] <= env.total - (1 << 20)            # ... and not fetched again
    assert env.host_files("b300a", BIG)[shard][0] == env.files[BIG][shard]["sha256"]


# --- 4. wrong bytes at the source ---------------------------------------------------------------------------------------
def test_wrong_checksum_at_the_source_is_rejected_never_served_serving_copy_untouched(env, sandbox):
    shard = "model-00003-of-00003.safetensors"
    bad_src = env.tmp / "bad" / "models"
    (bad_src / BIG).mkdir(parents=True)
    for n in env.files[BIG]:
        (bad_src / BIG / n).write_bytes((env.src / BIG / n).read_bytes())
    (bad_src / BIG / shard).write_bytes(os.urandom(env.files[BIG][shard]["size"]))      # the source's wrong bytes
    new = dict(env.files[BIG], **{shard: {"sha256": hashlib.sha256(b"the revision we pinned").hexdigest(),
                                          "size": env.files[BIG][shard]["size"]}})
    man = env.tmp / "manifests-new"
    write_manifest(man, BIG, new)
    write_manifest(man, DRAFT, env.files[DRAFT])
    (bad_src / DRAFT).mkdir(parents=True)
    before = env.host_files("b300a", BIG)
    rc, tasks, _out = env.play(limit="b300a", ok=False, model_weights_manifest_dir=str(man),
                               model_weights_source={"type": "path", "where": "controller", "path": str(bad_src)})
    assert rc != 0
    found = hashlib.sha256((bad_src / BIG / shard).read_bytes()).hexdigest()
    err = " ".join(stage_result(tasks, "b300a")["errors"])
    assert ("b300a: %s/%s from the controller (http://%s:31990): found sha256 %s, %d bytes; expected sha256 %s, "
            "%d bytes (manifest %s/%s.json); the file was removed and is never served; the serving copy is untouched"
            % (BIG, shard, GATEWAY, found, new[shard]["size"], new[shard]["sha256"], new[shard]["size"], man, BIG)) in err
    assert env.host_files("b300a", BIG) == before                  # same bytes, same inodes, same marker
    staging = "%s/moonshotai/.Kimi-K3.b300-staging" % HOST_ROOT
    assert sandbox.exec("b300a", "ls -A '%s'" % staging).stdout.split() == [
        ".b300-staging.json", "config.json", "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
        "model.safetensors.index.json", "tokenizer.json"]          # the wrong file is nowhere, not even as .part


# --- 5. a manifest that names a file the source lacks, and a full disk ----------------------------------------------------
def test_a_manifest_naming_a_file_the_source_lacks_is_refused_before_the_first_byte(env, sandbox):
    man = env.tmp / "manifests-extra"
    extra = dict(env.files[BIG], **{"model-00004-of-00003.safetensors": {"sha256": "ab" * 32, "size": 4096}})
    write_manifest(man, BIG, extra)
    write_manifest(man, DRAFT, env.files[DRAFT])
    before = env.host_files("b300a", BIG)
    rc, tasks, _out = env.play(limit="b300a", ok=False, model_weights_manifest_dir=str(man))
    assert rc != 0
    text = msgs(tasks)
    assert ("controller: the source %s lacks %s/model-00004-of-00003.safetensors (found: no such file %s/%s/"
            "model-00004-of-00003.safetensors; expected 4096 bytes, sha256 %s, manifest %s/%s.json); nothing was "
            "written" % (env.src, BIG, env.src, BIG, "ab" * 32, man, BIG)) in text
    assert "Stage | stage job state" not in tasks
    assert env.host_files("b300a", BIG) == before


def test_a_full_disk_is_refused_before_the_first_byte_naming_need_and_shortfall(env, sandbox):
    """A 2 MiB tmpfs mounted in b300a (podman exec --privileged: the container itself may not mount) holds the model
    root: the stage needs ~7 MiB and refuses before writing anything."""
    r = sandbox.run(["podman", "exec", "--privileged", "b300-b300a", "sh", "-c",
                     "mkdir -p /srv/wtiny && mount -t tmpfs -o size=2m tmpfs /srv/wtiny"], check=False)
    assert r.returncode == 0, "cannot mount a small tmpfs in b300a: %s" % r.stderr
    try:
        rc, tasks, _out = env.play(limit="b300a", ok=False, sglang_model_root="/srv/wtiny/models")
        assert rc != 0
        text = msgs(tasks)
        assert re.search(r"b300a: not enough free space on /srv/wtiny \(tmpfs, tmpfs\) for %s, %s: need [\d.]+ MiB "
                         r"\([\d.]+ MiB still to fetch \+ 0 B reserve, model_weights_reserve_gib\), available [\d.]+ "
                         r"MiB: short by [\d.]+ MiB; nothing was written" % (re.escape(DRAFT), re.escape(BIG)), text), text
        assert sandbox.exec("b300a", "ls -A /srv/wtiny").stdout.strip() == ""
    finally:
        sandbox.run(["podman", "exec", "--privileged", "b300-b300a", "umount", "/srv/wtiny"], check=False)


# --- 6. S3 with credentials: nowhere in argv, output or artifacts -------------------------------------------------------
PS_SAMPLER = r"""
import os, time
seen = set()
while not os.path.exists("/tmp/wtest-ps.stop"):
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                seen.add(open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                pass
    time.sleep(0.02)
open("/tmp/wtest-ps.txt", "w").write("\n".join(sorted(seen)))
open("/tmp/wtest-ps.done", "w").close()
"""

def test_s3_source_credentials_never_in_argv_output_or_artifacts(env, sandbox, tmp_path):
    py = subprocess.run([str(ROOT / "tools/weights-s3-venv.sh")], capture_output=True, text=True, timeout=900)
    assert py.returncode == 0, "the S3 double's venv (tools/weights-s3-venv.sh) failed: %s" % py.stderr[-2000:]
    python = py.stdout.strip().splitlines()[-1]
    s = socket.socket()
    s.bind((GATEWAY, 0))
    port = s.getsockname()[1]
    s.close()
    key_id, secret = "AKIA" + os.urandom(8).hex().upper(), "s3cret-" + os.urandom(16).hex()
    moto = subprocess.Popen([python, "-m", "moto.server", "-H", GATEWAY, "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        upload = ("import boto3, os, sys; c = boto3.client('s3', endpoint_url=sys.argv[1], region_name='us-east-1', "
                  "aws_access_key_id=os.environ['K'], aws_secret_access_key=os.environ['S']); c.create_bucket(Bucket='models')\n"
                  "for d, _s, fs in os.walk(sys.argv[2]):\n"
                  "    for f in fs:\n"
                  "        p = os.path.join(d, f); c.upload_file(p, 'models', 'weights/' + os.path.relpath(p, sys.argv[2]))")
        for _ in range(50):
            if subprocess.run([python, "-c", upload, "http://%s:%d" % (GATEWAY, port), str(env.src)],
                              env=dict(os.environ, K=key_id, S=secret), capture_output=True).returncode == 0:
                break
            time.sleep(0.2)
        vault = tmp_path / "vault.yml"
        vault.write_text("model_weights_s3_access_key_id: %s\nmodel_weights_s3_secret_access_key: %s\n" % (key_id, secret))
        vault.chmod(0o600)
        sandbox.exec("b300a", "rm -rf '%s'" % HOST_ROOT)
        # the process table of the host every 20 ms from inside it (every argv seen, once), and the controller's
        sandbox.run(["podman", "exec", "-d", "b300-b300a", "python3", "-c", PS_SAMPLER])
        samples, stop = [], threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout)
                time.sleep(0.05)
        th = threading.Thread(target=sample)
        th.start()
        try:
            _rc, tasks, out = env.play(limit="b300a", vars_file=vault, model_weights_source={
                "type": "s3", "endpoint": "http://%s:%d" % (GATEWAY, port), "bucket": "models", "prefix": "weights",
                "region": "us-east-1"})
        finally:
            stop.set()
            th.join()
            sandbox.exec("b300a", "touch /tmp/wtest-ps.stop; for i in $(seq 50); do [ -f /tmp/wtest-ps.done ] && break; "
                                  "sleep 0.1; done")
        samples.append(sandbox.exec("b300a", "cat /tmp/wtest-ps.txt; rm -f /tmp/wtest-ps.*").stdout)
    finally:
        moto.terminate()
        moto.wait()
    r = stage_result(tasks, "b300a")
    assert r["bytes_fetched"] == env.total and r["models"][0]["sources"][0].startswith("s3 http://")
    assert any("rclone cat" in smp for smp in samples), "the sampler never saw rclone running"
    for text, where in [(smp, "the process table") for smp in samples] + [(out, "the playbook output")]:
        assert secret not in text and key_id not in text, "a credential is in %s" % where
    # nothing of the run is left, but the weights server's port locks (.serve-<port>.b300-lock, kept for good by
    # design: removing a flock file races; they hold a pid and a run id, never a credential: the grep covers them)
    leftovers = sandbox.exec("b300a", "ls -A /run/b300-weights 2>/dev/null | grep -v '^[.]serve-[0-9]*[.]b300-lock$'; "
                                      "grep -rl '%s' /root/.ansible_async /run/b300-weights %s 2>/dev/null; true"
                             % (secret, HOST_ROOT)).stdout.split()
    assert leftovers == [], leftovers
    assert secret not in "".join(p.read_text(errors="replace") for p in (ROOT / "artifacts").rglob("*")
                                 if p.is_file() and p.stat().st_size < 1 << 20) if (ROOT / "artifacts").is_dir() else True
