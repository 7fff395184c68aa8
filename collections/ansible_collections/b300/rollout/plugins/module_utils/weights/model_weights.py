# -*- coding: utf-8 -*-
"""The weights stage's decisions (issue 28): manifests, which model directories each host needs, what a directory
lacks, what may be linked or resumed, the free space it needs, the fan-out order and the messages. Pure functions on
plain data (the file system is read by the callers: plugins/modules/model_weights_stage.py on a host,
model_weights_plan.py on the controller; the copying itself is module_utils/weights/model_weights_io.py).

Manifest: SGLang's own format (sglang/srt/utils/model_file_verifier.py, identical in 0.5.17 and 0.5.18):
    {"files": {"<name relative to the model directory>": {"sha256": "<64 hex>", "size": <bytes>}}}
`python -m sglang.srt.utils.model_file_verifier generate|verify --model-path DIR --model-checksum FILE` writes and
checks it (tests/parser/test_weights_contract.py runs the real one on what this code writes). Its digest is the
sha256 of the canonical JSON (sorted keys, no spaces): the one value an inventory pins for a whole model.

On a host, a model directory FINAL (e.g. /models/moonshotai/Kimi-K3) is only ever replaced whole:
    <parent>/.<name>.b300-staging/            sibling, same file system: files being fetched (<name>.part) and
                                              verified ones (their final name), .b300-staging.json (what is verified)
    FINAL/.b300-stage.json                    the marker: manifest digest + per file size, mtime_ns, inode
    FINAL/.b300-manifest.json                 the manifest itself, for `model_file_verifier verify` by hand
The staging directory is swapped into place (renameat2 RENAME_EXCHANGE) only when every file is verified. A no-change
run compares the marker with one stat per file: no weight byte is read.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import hashlib
import json
import posixpath
import re

MARKER_NAME = ".b300-stage.json"
MANIFEST_NAME = ".b300-manifest.json"
STAGING_STATE = ".b300-staging.json"
STAGING_SUFFIX = ".b300-staging"
PART_SUFFIX = ".part"
MARKER_FORMAT = "b300-weights-stage/1"
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# Files a router-only host needs of a model (the router loads the tokenizer, never the weights): everything but these.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt", ".npz", ".onnx")
SOURCE_TYPES = ("none", "path", "http", "s3")
# model_weights_source's shape as an Ansible argument spec (plain data: the option `source` of
# b300.rollout.model_weights_plan), declared where Ansible checks it (issue 39): the type, the keys each type needs
# (required_if), where a path is, and no key beyond these. No spec can say the rest, so Python keeps it:
# input_rules.rule_weights_source (an absolute normalized path, an http(s) URL without credentials, the characters).
SOURCE_SPEC = dict(
    type="dict", default={"type": "none"},
    options=dict(
        type=dict(type="str", default="none", choices=list(SOURCE_TYPES)),
        path=dict(type="str"),
        where=dict(type="str", default="host", choices=["host", "controller"]),
        url=dict(type="str"),
        ca_file=dict(type="str"),
        endpoint=dict(type="str"),
        bucket=dict(type="str"),
        prefix=dict(type="str"),
        region=dict(type="str"),
        provider=dict(type="str"),
    ),
    required_if=[("type", "path", ("path",)), ("type", "http", ("url",)), ("type", "s3", ("endpoint", "bucket"))],
)
GIB = 1024 ** 3


class ManifestError(ValueError):
    """A manifest that cannot be used; the message names where it came from and what is wrong."""


# --- manifests -------------------------------------------------------------------------------------------------------
def check_name(name):
    """None when `name` is a usable file name inside a model directory, else why not."""
    if not isinstance(name, str) or not name:
        return "an empty or non-string name"
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return "an absolute path or a backslash/NUL"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return "a path with an empty, '.' or '..' component"
    if any(p.endswith(PART_SUFFIX) for p in parts) or parts[0] in (MARKER_NAME, MANIFEST_NAME, STAGING_STATE):
        return "a name the stage uses itself (%s, %s, %s, *%s)" % (MARKER_NAME, MANIFEST_NAME, STAGING_STATE,
                                                                   PART_SUFFIX)
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "a control character"
    return None


def check_models(host, models):
    """[problems] of the model list a host module is handed (it re-checks what the controller checked: a name is
    never trusted on the way): every `rel` and file name a plain relative name (check_name: no '..', no absolute
    path, no NUL), every `final` an absolute, normalised path."""
    out = []
    for m in models or []:
        rel, final = m.get("rel"), m.get("final")
        why = check_name(rel) if isinstance(rel, str) else "not a string"
        if why:
            out.append("%s: model rel %r: %s; expected a relative path such as org/Model; fix: the inventory's model "
                       "path (sglang_model_root and the profile's --model-path)" % (host, rel, why))
        if not isinstance(final, str) or not final.startswith("/") or posixpath.normpath(final) != final \
                or "\x00" in final:
            out.append("%s: model directory %r: expected an absolute, normalised path (no '..', no '//', no trailing "
                       "'/'); fix: sglang_model_root" % (host, final))
        for name in sorted((m.get("files") or {}), key=str):
            why = check_name(name)
            if why:
                out.append("%s: %s: file name %r in its manifest (%s): %s; nothing was written; fix: the manifest "
                           "lists names inside the model directory only (tools/weights-manifest writes them)"
                           % (host, rel, name, m.get("where") or "?", why))
    return out


def probe_message(host, source, rel, bad, files, where):
    """The refusal before the first byte, from probe results {name: (kind, why)}: files the source lacks or holds
    with another size, a source that refuses the credentials, or one that does not answer (not called 'lacks')."""
    listing = [why for kind, why in bad.values() if kind == "listing"]
    if listing:
        return ("%s: the source (%s) could not be listed, so none of the files %s needs was checked: %s; nothing was "
                "written; fix: check that the endpoint answers from this host, the bucket and prefix "
                "(model_weights_source) and the S3 keys in the vault (model_weights_s3_access_key_id / "
                "_secret_access_key), then re-run (manifest %s)" % (host, source, rel, listing[0], where))
    groups = {}
    for n, (kind, why) in sorted(bad.items()):
        groups.setdefault(kind, []).append("%s (found: %s; expected %d bytes, sha256 %s)" % (
            n, why, int(files[n]["size"]), files[n]["sha256"]))
    out = []
    heads = {
        "missing": ("lacks %d of the files %s needs", "put them at the source, or correct the manifest (%s)"),
        "size": ("holds %d of the files %s needs with another size (a truncated or different copy)",
                 "replace them at the source with the manifest's files, or correct the manifest (%s)"),
        "denied": ("refuses %d of the files %s needs (HTTP 401/403: credentials)",
                   "check model_weights_http_* / the S3 keys in the vault (manifest %s)"),
        "symlink": ("holds %d of the files %s needs as symlinks (refused: a link may point outside the source)",
                    "replace the links by the files themselves at the source (manifest %s)"),
        "network": ("did not answer for %d of the files %s needs after the retries (connection refused, reset or "
                    "timed out)", "check that the source is up and reachable from this host, then re-run (manifest "
                    "%s)"),
        "server": ("answered with a server error (HTTP 5xx) for %d of the files %s needs after the retries",
                   "the source's server is failing: check it, then re-run (manifest %s)"),
    }
    for kind in sorted(groups):
        head, fix = heads.get(kind, ("failed for %d of the files %s needs", "check the source, then re-run (manifest "
                                     "%s)"))
        items = groups[kind]
        out.append("%s: the source (%s) %s: %s; nothing was written; fix: %s" % (
            host, source, head % (len(items), rel), "; ".join(items[:10]), fix % where))
    return " || ".join(out)


def parse_manifest(data, where):
    """{name: {"sha256", "size"}} of a model_file_verifier manifest (a dict, or its JSON text); ManifestError naming
    `where` (the file) otherwise. The deprecated {"checksums": {name: sha256}} form has no sizes: refused (the free
    space check and resume need them), with the command that regenerates it."""
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except ValueError as exc:
            raise ManifestError("%s: not JSON (%s)" % (where, exc)) from None
    if not isinstance(data, dict):
        raise ManifestError("%s: expected a JSON object {\"files\": {...}}, found %s" % (where, type(data).__name__))
    if "files" not in data and "checksums" in data:
        raise ManifestError("%s: the deprecated {\"checksums\": ...} form (no sizes); regenerate it: python -m "
                            "sglang.srt.utils.model_file_verifier generate --model-path <trusted copy> "
                            "--model-checksum %s (or tools/weights-manifest)" % (where, where))
    files = data.get("files")
    if not isinstance(files, dict) or not files:
        raise ManifestError("%s: no \"files\" mapping (expected {\"files\": {name: {\"sha256\", \"size\"}}})" % where)
    out, problems = {}, []
    for name, info in files.items():
        why = check_name(name)
        if why:
            problems.append("%r is %s" % (name, why))
            continue
        if not isinstance(info, dict):
            problems.append("%s: expected {\"sha256\", \"size\"}, found %s" % (name, type(info).__name__))
            continue
        digest, size = info.get("sha256"), info.get("size")
        if not isinstance(digest, str) or not SHA256_RE.match(digest.lower()):
            problems.append("%s: sha256 %r is not 64 hex digits" % (name, digest))
        elif isinstance(size, bool) or not isinstance(size, int) or size < 0:
            problems.append("%s: size %r is not a byte count >= 0" % (name, size))
        else:
            out[name] = {"sha256": digest.lower(), "size": size}
    lower = {}
    for name in out:
        lower.setdefault(name.lower(), []).append(name)
    problems += ["%s differ only in case" % " and ".join(sorted(v)) for v in lower.values() if len(v) > 1]
    prefixes = {"/".join(n.split("/")[:i]) for n in out for i in range(1, n.count("/") + 1)}
    problems += ["%s is both a file and a directory" % n for n in sorted(prefixes & set(out))]
    if problems:
        raise ManifestError("%s: %s" % (where, "; ".join(problems[:10]) + (" ..." if len(problems) > 10 else "")))
    return out


def manifest_digest(files):
    """sha256 of the canonical manifest JSON: what an inventory pins for a whole model (model_weights_digests)."""
    canon = {"files": {n: {"sha256": f["sha256"], "size": int(f["size"])} for n, f in files.items()}}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def manifest_text(files):
    """The manifest as SGLang's `generate` writes it (json.dumps(..., indent=2, sort_keys=True))."""
    return json.dumps({"files": {n: {"sha256": f["sha256"], "size": int(f["size"])} for n, f in files.items()}},
                      indent=2, sort_keys=True)


def subset(files, need):
    """The files a host needs: all of them ('full'), or all but the weights ('tokenizer': a router-only host)."""
    if need == "full":
        return dict(files)
    return {n: f for n, f in files.items() if not n.lower().endswith(WEIGHT_SUFFIXES)}


def status_name(rel):
    """File name of a model's run status in the run directory (status, failed files, heartbeat), read by the server
    the host runs for its peers."""
    return "status-%s.json" % hashlib.sha256(rel.encode("utf-8")).hexdigest()[:16]


def total_bytes(files):
    return sum(int(f["size"]) for f in files.values())


def fetch_order(files):
    """Largest first, then by name: the big shards start early and a peer pulling behind this host waits at the end
    for a small file, not for a 5 GB one (the chain's tail is one small file)."""
    return sorted(files, key=lambda n: (-int(files[n]["size"]), n))


# --- which hosts need which model directories -------------------------------------------------------------------------
def arg_value(args, flag):
    """Value of --flag in an argv list (--flag V or --flag=V); None when absent or bare."""
    for i, a in enumerate(args or []):
        if a == flag and i + 1 < len(args) and not str(args[i + 1]).startswith("--"):
            return args[i + 1]
        if isinstance(a, str) and a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def model_rel(path, model_root):
    """The model directory relative to the model root (the same relative path at the source), or None when the path
    is not below it."""
    root = posixpath.normpath(model_root or "/")
    p = posixpath.normpath(path)
    if root == "/" or not p.startswith(root + "/"):
        return None
    return p[len(root) + 1:]


def models_by_host(plan, model_root):
    """{host: {final path: {"rel", "need", "for"}}} from the sglang plan: every --model-path and
    --speculative-draft-model-path of each instance ('full'), and the router's --model-path/--tokenizer-path
    ('tokenizer' on the router host, unless a worker there needs the full model). Also the errors (a model path
    outside the model root has no place at the source)."""
    out, errors = {}, []

    def add(host, path, need, who):
        if not isinstance(path, str) or not path:
            return
        rel = model_rel(path, model_root)
        if rel is None:
            errors.append("%s: %s uses %s, which is not below sglang_model_root %s: the weights stage fetches "
                          "<source>/<path below the root>; fix: keep every model directory under sglang_model_root"
                          % (host, who, path, model_root))
            return
        entry = out.setdefault(host, {}).setdefault(posixpath.normpath(path), {"rel": rel, "need": need, "for": []})
        if need == "full":
            entry["need"] = "full"
        entry["for"].append(who)

    for inst in (plan or {}).get("instances") or []:
        for flag in ("--model-path", "--speculative-draft-model-path"):
            add(inst["host"], arg_value(inst.get("args"), flag), "full", "%s %s" % (inst["id"], flag))
    router = (plan or {}).get("router") or None
    if router:
        for flag in ("--model-path", "--tokenizer-path"):
            add(router["host"], arg_value(router.get("args"), flag), "tokenizer", "router %s" % flag)
    return out, errors


# --- the state of one directory on a host ---------------------------------------------------------------------------
def stat_key(st):
    """[size, mtime_ns, inode] of an os.stat_result: what must stay the same for a file the stage verified.

    Not ctime: a hard link made or removed changes it, and the stage links a serving copy's proven files into the
    staging directory and removes the old directory after the swap; with ctime in the key every swap (and every run
    that failed after linking) would leave markers that force a full re-hash. What the key misses (a rewrite in
    place that keeps the size and restores the mtime) is what model_weights_verify: full is for."""
    return [int(st.st_size), int(st.st_mtime_ns), int(st.st_ino)]


def not_as_verified(keys, verified):
    """Names whose stat key now ({name: key}) is not the one recorded when the file was verified ({name: {"stat"}}):
    the marker is written only when this is empty (a file replaced at its name after it was hashed is never
    labelled verified)."""
    return sorted(n for n, key in keys.items() if list(key) != list((verified.get(n) or {}).get("stat") or []))


def marker_doc(model, digest, files, keys, source, need, when):
    """The marker written last into a complete directory: what was verified and the stat key of each file then."""
    return {"format": MARKER_FORMAT, "model": model, "manifest_sha256": digest, "need": need, "source": source,
            "staged_at": when,
            "files": {n: {"sha256": files[n]["sha256"], "size": int(files[n]["size"]), "stat": keys[n]}
                      for n in sorted(files)}}


def marker_files_digest(marker):
    """The manifest digest the marker's own file list gives (a marker edited by hand does not match its claim)."""
    return manifest_digest({n: {"sha256": f.get("sha256"), "size": f.get("size")}
                            for n, f in (marker.get("files") or {}).items()})


def judge_final(files, digest, marker, stats, exists=True):
    """What a final directory holds, from its marker and one stat per file ({name: stat key}, absent names missing).

    Returns {"state": "absent" | "complete" | "relabel" | "incomplete",
             "marker": "none" | "valid" | "invalid",
             "good": {name: key}  files proven by the marker (same sha256 and size recorded, same stat key now),
             "changed": [names]   recorded by the marker, but the stat key differs (rewritten, replaced, touched),
             "unproven": {name: key}  present with the manifest's size, without proof (adopted by hashing them),
             "missing": [names], "wrong_size": {name: size}}
    complete: every file proven and the marker is for this manifest; relabel: every file proven, the marker names
    another manifest (only the marker is rewritten)."""
    mfiles = (marker or {}).get("files") or {}
    valid = bool(marker) and marker.get("format") == MARKER_FORMAT and marker_files_digest(marker) == marker.get(
        "manifest_sha256")
    good, changed, unproven, missing, wrong = {}, [], {}, [], {}
    for name in sorted(files):
        want = files[name]
        key = stats.get(name)
        if key is None:
            missing.append(name)
            continue
        rec = mfiles.get(name) if valid else None
        if rec and rec.get("sha256") == want["sha256"] and int(rec.get("size", -1)) == int(want["size"]):
            if list(rec.get("stat") or []) == list(key):
                good[name] = key
                continue
            changed.append(name)
        if int(key[0]) != int(want["size"]):
            wrong[name] = int(key[0])
        else:
            unproven[name] = key
    if not exists:
        state = "absent"
    elif len(good) == len(files):
        state = "complete" if marker.get("manifest_sha256") == digest else "relabel"
    else:
        state = "incomplete"
    return {"state": state, "marker": "none" if not marker else ("valid" if valid else "invalid"), "good": good,
            "changed": changed, "unproven": unproven, "missing": missing, "wrong_size": wrong}


def plan_files(files, final, staging_state, staging_stats, part_sizes, verify_full=False):
    """Per file of the manifest, how it gets into the new directory (fetch order):
        link      a file of the final directory proven by its marker: hard-linked into the staging directory
        have      already verified in the staging directory by an earlier run (its record and stat key match)
        adopt     present (final or staging) with the right size but unproven: hashed once, linked when it matches
        resume    a .part of the same expected sha256 holds N bytes: its prefix is re-hashed, the rest fetched
        fetch     everything else
    `final` is judge_final()'s result, `staging_state` the staging directory's record ({"verified": {name: {sha256,
    stat}}, "parts": {name: sha256}}), `staging_stats` {name: key} of verified-looking files there, `part_sizes`
    {name: bytes}. verify_full: nothing is taken on a marker's word (every present file is hashed)."""
    verified = (staging_state or {}).get("verified") or {}
    parts_for = (staging_state or {}).get("parts") or {}
    out = []
    for name in fetch_order(files):
        want = files[name]
        size = int(want["size"])
        rec = verified.get(name)
        skey = staging_stats.get(name)
        if (not verify_full and rec and rec.get("sha256") == want["sha256"] and skey is not None
                and list(rec.get("stat") or []) == list(skey)):
            out.append({"name": name, "action": "have", "bytes": 0})
        elif not verify_full and name in final["good"]:
            out.append({"name": name, "action": "link", "bytes": 0})
        elif skey is not None and int(skey[0]) == size:
            out.append({"name": name, "action": "adopt", "from": "staging", "bytes": 0, "hash_bytes": size})
        elif name in final["unproven"] or (verify_full and name in final["good"]):
            out.append({"name": name, "action": "adopt", "from": "final", "bytes": 0, "hash_bytes": size})
        elif name in part_sizes and parts_for.get(name) == want["sha256"] and 0 < part_sizes[name] <= size:
            have = int(part_sizes[name])
            out.append({"name": name, "action": "resume", "offset": have, "bytes": size - have, "hash_bytes": have})
        else:
            out.append({"name": name, "action": "fetch", "offset": 0, "bytes": size})
    return out


def needs_work(actions):
    """Whether the directory must be (re)built: anything but files already proven."""
    return any(a["action"] != "link" for a in actions)


def space_need(actions, files):
    """Bytes the staging directory will still add: fetched and resumed bytes (a link, or a file adopted from the final
    directory and linked, adds none; a stale .part of another content is removed first)."""
    return sum(int(a.get("bytes", 0)) for a in actions if a["action"] in ("fetch", "resume"))


def space_verdict(host, fs, need_bytes, avail_bytes, reserve_bytes, models):
    """None, or the refusal naming host, file system, need, available, reserve and shortfall."""
    if need_bytes + reserve_bytes <= avail_bytes:
        return None
    short = need_bytes + reserve_bytes - avail_bytes
    return ("%s: not enough free space on %s for %s: need %s (%s still to fetch + %s reserve, "
            "model_weights_reserve_gib), available %s: short by %s; nothing was written; fix: free %s there, or put "
            "sglang_model_root on a larger file system" % (
                host, fs, ", ".join(models), human(need_bytes + reserve_bytes), human(need_bytes),
                human(reserve_bytes), human(avail_bytes), human(short), human(short)))


# --- fan-out -----------------------------------------------------------------------------------------------------------
def fanout(model_hosts, states, fanout_on=True):
    """Who pulls a model from where, so the source sends each byte once.

    model_hosts: {digest-or-key: [hosts in inventory order]}; states: {(key, host): "complete" | "needs"}.
    Returns {(key, host): {"from": "source" | "peer", "peer": host or None, "serves": bool}}.
    Hosts with a complete copy are seeds; the hosts that need the model form a chain: the first pulls from a seed
    (else from the source), each next one from the one before it, file by file as the one before verifies it. Without
    fan-out every host that needs it pulls from the source."""
    out = {}
    for key, hosts in model_hosts.items():
        seeds = [h for h in hosts if states.get((key, h)) == "complete"]
        needers = [h for h in hosts if states.get((key, h)) != "complete"]
        prev = seeds[0] if (seeds and fanout_on) else None
        for h in needers:
            if prev is None:
                out[(key, h)] = {"from": "source", "peer": None, "serves": False}
            else:
                out[(key, h)] = {"from": "peer", "peer": prev, "serves": False}
                out.setdefault((key, prev), {"from": None, "peer": None, "serves": False})["serves"] = True
            if fanout_on:
                prev = h
    return out


# --- messages ---------------------------------------------------------------------------------------------------------
def human(n):
    """Bytes for a person: 412.3 GiB, 5.0 MiB, 900 B."""
    n = float(n)
    for unit, size in (("TiB", 1024 ** 4), ("GiB", GIB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return "%.1f %s" % (n / size, unit)
    return "%d B" % n


def duration(s):
    s = int(round(max(0, s)))
    if s >= 3600:
        return "%d h %02d m" % (s // 3600, s % 3600 // 60)
    if s >= 60:
        return "%d m %02d s" % (s // 60, s % 60)
    return "%d s" % s


def progress_line(host, p):
    """One line per host for the play's progress step: bytes, rate, ETA, files, where from."""
    if not p:
        return "%s: no progress yet" % host
    done, total = int(p.get("bytes_done", 0)), int(p.get("bytes_total", 0))
    rate = float(p.get("rate_bps", 0))
    left = max(0, total - done)
    eta = duration(left / rate) if rate > 0 else "?"
    pct = 100.0 * done / total if total else 100.0
    if p.get("waiting_on_lock"):
        return str(p["waiting_on_lock"])
    return "%s: %s of %s (%.0f%%) at %s/s, ETA %s; files %d/%d; from %s%s" % (
        host, human(done), human(total), pct, human(rate), eta, int(p.get("files_done", 0)),
        int(p.get("files_total", 0)), ", ".join(p.get("sources") or ["-"]),
        " (finished)" if p.get("finished") else "")


def source_failure_text(exc, kind, attempts, have, size, part):
    """What a source failure mid-file means for the operator, by its kind (model_weights_io.classify_failure):
    a short source (HTTP 416) can never be finished by a re-run; a server or network failure can once the source
    answers; refused credentials need the vault."""
    kept = "%d of %d bytes kept in %s" % (have, size, part)
    if kind == "short":
        return ("%s: the source holds fewer bytes than the manifest's %d (it refused a range from byte %d); %s; a "
                "re-run cannot finish it: the file at the source is short (truncated) or another file; fix: "
                "replace it at the source, or correct the manifest" % (exc, size, have, kept))
    if kind == "server":
        return ("%s (a server error; %d attempts with backoff, model_weights_retries; %s: a re-run resumes there "
                "once the source's server works)" % (exc, attempts, kept))
    if kind == "network":
        return ("%s (the source did not answer: connection refused, reset or timed out; %d attempts with backoff, "
                "model_weights_retries; %s: a re-run resumes there once the source is reachable)" % (
                    exc, attempts, kept))
    if kind == "denied":
        return "%s (the source refused the credentials; %s; fix: the credentials in the vault)" % (exc, kept)
    if kind == "missing":
        return "%s (the source no longer has the file; %s; fix: put it back at the source)" % (exc, kept)
    return "%s (%d attempts; %s: a re-run resumes there)" % (exc, attempts, kept)


def lock_refusal(host, final, holder, waited_s, takeover):
    """A stage run refused because another one holds the model directory's lock."""
    return ("%s: %s is being staged by another run: %s; waited %d s (model_weights_lock_wait_s)%s; nothing was "
            "written by this run; fix: let that run finish (its progress: the run directory's progress.json), or "
            "re-run with -e model_weights_takeover=true to end it first (its verified files and .part files are "
            "kept and resumed)" % (host, final, holder, int(waited_s),
                                   "; the takeover's SIGTERM did not end it" if takeover else ""))


def mismatch_message(host, model, name, origin, got_sha, got_size, want, manifest_where):
    """A file whose bytes are not the manifest's: host, file, found, expected, and that nothing is served."""
    return ("%s: %s/%s from %s: found sha256 %s, %s bytes; expected sha256 %s, %d bytes (manifest %s); the file was "
            "removed and is never served; the serving copy is untouched; fix: the source holds other bytes than the "
            "manifest: replace the file at the source, or the manifest if the source is the trusted copy" % (
                host, model, name, origin, got_sha, got_size, want["sha256"], int(want["size"]), manifest_where))


# --- the controller's plan ------------------------------------------------------------------------------------------------
def source_for(source, controller_url):
    """The source mapping a host's stage gets, from model_weights_source (secrets never here)."""
    t = (source or {}).get("type") or "none"
    if t == "path" and (source.get("where") or "host") == "controller":
        return {"type": "controller", "url": controller_url, "host": "controller"}
    if t == "path":
        return {"type": "path", "path": source["path"]}
    if t == "http":
        return {"type": "http", "url": source["url"], "ca_file": source.get("ca_file") or ""}
    if t == "s3":
        return {"type": "s3", "endpoint": source.get("endpoint") or "", "bucket": source.get("bucket") or "",
                "prefix": source.get("prefix") or "", "region": source.get("region") or "",
                "provider": source.get("provider") or "Other", "ca_file": source.get("ca_file") or ""}
    return {"type": "none"}


def stage_plan(host_models, states, source, controller_url, serve_urls, fanout_on=True):
    """Per host: the models to stage (each with its source and fallback) and the models to serve to peers; and the
    models the controller serves (a controller path source). host_models {host: [model entries in the same order on
    every host]}, states {host: {rel: state}} from inspect, serve_urls {host: http://address:port}."""
    src = source_for(source, controller_url)
    order = []
    hosts_of = {}
    for h, models in host_models.items():
        for m in models:
            key = (m["rel"], m["digest"])
            if key not in hosts_of:
                order.append(key)
            hosts_of.setdefault(key, []).append(h)
    flat = {}
    for key, hosts in hosts_of.items():
        for h in hosts:
            flat[(key, h)] = "complete" if states.get(h, {}).get(key[0]) == "complete" else "needs"
    fo = fanout(hosts_of, flat, fanout_on)
    out = {h: {"stage": [], "serve": []} for h in host_models}
    controller = []
    for h, models in host_models.items():
        for m in models:
            key = (m["rel"], m["digest"])
            d = fo.get((key, h))
            if d is None:
                continue
            if d["serves"]:
                out[h]["serve"].append(m)
            if d["from"] == "source":
                out[h]["stage"].append(dict(m, source=src, fallback=None))
                if src["type"] == "controller" and m["rel"] not in [c["rel"] for c in controller]:
                    controller.append(m)
            elif d["from"] == "peer":
                peer = {"type": "peer", "url": serve_urls[d["peer"]], "host": d["peer"]}
                out[h]["stage"].append(dict(m, source=peer, fallback=src if src["type"] != "none" else None))
                if src["type"] == "controller" and m["rel"] not in [c["rel"] for c in controller]:
                    controller.append(m)     # the fallback of a peer that fails
    return {"hosts": out, "controller": controller, "source": src}


def summary_lines(host, result):
    """The end-of-stage lines of one host: per model what happened, bytes, time, rate, source; then the notes."""
    if not result:
        return ["%s: nothing staged" % host]
    lines = []
    for m in result.get("models") or []:
        what = m.get("result") or m.get("state")
        if what in ("unchanged", "complete"):
            lines.append("%s: %s complete, unchanged (%d files, %s; stat only)" % (
                host, m.get("final"), int(m.get("files") or 0), human(m.get("bytes_total") or 0)))
            continue
        t = float(m.get("elapsed_s") or 0)
        moved = int(m.get("fetch_bytes") or 0)
        lines.append("%s: %s %s: %d files, %s; fetched %s%s from %s; swap %s" % (
            host, m.get("final"), what, int(m.get("files") or 0), human(m.get("bytes_total") or 0), human(moved),
            (" in %s (%s/s)" % (duration(t), human(moved / t))) if t > 0 and moved else "",
            ", ".join(m.get("sources") or ["-"]), m.get("swap") or "-"))
    tot = float(result.get("elapsed_s") or 0)
    lines.append("%s: %s received in %s (%s/s); %s of weight files read on this host (resumed prefixes, adopted "
                 "files); process rchar %s, write_bytes %s" % (
                     host, human(result.get("bytes_fetched") or 0), duration(tot),
                     human((result.get("bytes_fetched") or 0) / tot) if tot else "0 B",
                     human(result.get("weight_bytes_read") or 0), human((result.get("io") or {}).get("rchar", 0)),
                     human((result.get("io") or {}).get("write_bytes", 0))))
    lines += ["%s: note: %s" % (host, n) for n in result.get("notes") or []]
    return lines
