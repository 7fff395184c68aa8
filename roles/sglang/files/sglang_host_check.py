#!/usr/bin/env python3
"""Read-only host checks of the sglang role's preflight (run on each worker host, stdlib only).

  sglang_host_check.py '<json spec>'

spec: {"host": NAME,
       "instances": [{"id", "args": [argv...], "gpus": [..]}],   # this host's instances (the plan)
       "gpu_memory_mib": N | null,                               # per GPU (gpu_topology facts)
       "model_check": bool, "protect_home": "yes"|"read-only"|"tmpfs"|"no", "user": NAME,
       "manifest": {path: sha256} | {}, "size_tolerance_pct": 5,
       "verify": "marker" | "full", "deferred": bool,                 # the weights stage's marker (below)
       "memory_check": bool, "memory_reserve_gib": N,
       "disk_paths": [path...], "disk_min_free_gib": N,
       "advertise_address": ADDR | null}

Checks: every model directory of the instances (--model-path, --speculative-draft-model-path) exists, holds
config.json, tokenizer files and every shard its model.safetensors.index.json lists, with a total size within the
tolerance of the index's metadata.total_size; it is readable by the service user, and not hidden by ProtectHome=;
the optional manifest's sha256 match; host RAM covers the hierarchical cache (R x KV pool per rank); free disk under
the install and log paths; the advertise address is one of this host's addresses and not loopback.
Prints one JSON line {"ok", "problems": [...], "facts": {...}}; exit 0 ok, 2 problems. Every problem names the host,
the item, the found and expected values and the fix.

A directory the weights stage (roles/model_weights) completed holds its marker .b300-stage.json: the manifest digest
and per file sha256, size and [size, mtime_ns, inode] when it was verified. When the marker is consistent and every
file still has its recorded stat, the manifest entries of sglang_model_manifest under it are compared with the
marker's sha256 instead of re-hashing (verify: full hashes anyway); a file whose stat changed since is refused.
deferred (site.yml's preflight when its weights step runs later in the same run): a missing or incomplete directory
is not a problem yet (the weights step stages it, the deploy's own check runs after it).
"""
import hashlib
import json
import os
import pwd
import grp
import re
import stat
import subprocess
import sys

GIB = 1024 ** 3
HIDDEN_BY_PROTECT_HOME = ("/home", "/root", "/run/user")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tiktoken.model", "vocab.json")


def arg_value(args, flag):
    """Value of --flag in an argv list (--flag V or --flag=V); True for a bare flag; None when absent."""
    for i, a in enumerate(args):
        if a == flag:
            nxt = args[i + 1] if i + 1 < len(args) else None
            return True if nxt is None or nxt.startswith("--") else nxt
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def user_ids(user, group=None):
    """(uid, gids) of the service user. One that does not exist yet (the deploy creates it after this check) has
    only the group the role will give it, when that group exists already (the weights stage creates it and hands
    the model directories to root:<group> 0750): (None, {that gid}); else (None, set()): 'others'."""
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        try:
            return None, {grp.getgrnam(group).gr_gid} if group else set()
        except KeyError:
            return None, set()
    gids = {pw.pw_gid} | {g.gr_gid for g in grp.getgrall() if user in g.gr_mem}
    return pw.pw_uid, gids


def can(path, uid, gids, want):
    """Whether uid/gids (None: a user that does not exist yet, i.e. 'others') has `want` (4 r, 1 x) on path."""
    st = os.stat(path)
    if uid == 0:
        return True
    if uid is not None and st.st_uid == uid:
        return bool(st.st_mode & (want << 6))
    if st.st_gid in gids:
        return bool(st.st_mode & (want << 3))
    return bool(st.st_mode & want)


def readable_problem(path, uid, gids, user):
    """First component of path the user cannot traverse or read, or None."""
    parts = os.path.abspath(path).split(os.sep)
    cur = os.sep
    for p in parts[1:]:
        if not can(cur, uid, gids, 1):
            return "directory %s is not searchable by %s (mode %o)" % (cur, user, stat.S_IMODE(os.stat(cur).st_mode))
        cur = os.path.join(cur, p)
    if os.path.isdir(cur):
        if not can(cur, uid, gids, 4) or not can(cur, uid, gids, 1):
            return "directory %s is not readable by %s (mode %o)" % (cur, user, stat.S_IMODE(os.stat(cur).st_mode))
    elif not can(cur, uid, gids, 4):
        return "file %s is not readable by %s (mode %o)" % (cur, user, stat.S_IMODE(os.stat(cur).st_mode))
    return None


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


MARKER = ".b300-stage.json"
MARKER_FORMAT = "b300-weights-stage/1"


def stage_marker(path):
    """(marker, stale names) of a directory the weights stage completed; (None, []) when it has no usable marker.
    Consistent = its file list hashes to the digest it claims (module_utils/weights/model_weights.py manifest_digest)."""
    try:
        with open(os.path.join(path, MARKER)) as fh:
            marker = json.load(fh)
    except (OSError, ValueError):
        return None, []
    files = marker.get("files") if isinstance(marker, dict) else None
    if marker.get("format") != MARKER_FORMAT or not isinstance(files, dict):
        return None, []
    canon = {"files": {n: {"sha256": f.get("sha256"), "size": f.get("size")} for n, f in files.items()}}
    if hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest() != marker.get(
            "manifest_sha256"):
        return None, []
    stale = []
    for name, f in sorted(files.items()):
        try:
            st = os.stat(os.path.join(path, name))
        except OSError:
            stale.append("%s (missing)" % name)
            continue
        now = [st.st_size, st.st_mtime_ns, st.st_ino]
        if now != list(f.get("stat") or [])[:3]:
            stale.append("%s (size/mtime_ns/inode %s, staged as %s)" % (name, now, f.get("stat")))
    return marker, stale


def check_model(host, label, path, spec, uid, gids):
    """(problems, total weight bytes or None) of one model directory."""
    probs = []
    user = spec.get("user") or "sglang"
    protect = str(spec.get("protect_home", "yes")).lower()
    if protect in ("yes", "true", "tmpfs") and any(path == h or path.startswith(h + "/") for h in HIDDEN_BY_PROTECT_HOME):
        probs.append("%s: %s model directory %s is under %s, which ProtectHome=%s hides from the service (a stat as root "
                     "succeeds, the worker sees nothing); fix: move the weights (e.g. under /models or /data) and set "
                     "sglang_model_root (or sglang_systemd_hardening: false, which drops ProtectHome= with the rest)" % (
                         host, label, path, next(h for h in HIDDEN_BY_PROTECT_HOME if path.startswith(h)), protect))
    marker, stale = stage_marker(path) if os.path.isdir(path) else (None, [])
    if spec.get("deferred") and (marker is None or stale):
        return probs, None      # the weights step of this run stages and verifies it; the deploy checks it after
    if not os.path.isdir(path):
        probs.append("%s: %s model directory %s is missing; expected the model's weights there (fix: run "
                     "playbooks/weights.yml, copy them, or set sglang_model_root)" % (host, label, path))
        return probs, None
    if marker is not None:
        spec.setdefault("_staged", {})[path] = marker
        if stale:
            probs.append("%s: %s model directory %s changed since the weights stage verified it (%s%s); expected every "
                         "file as staged; fix: run playbooks/weights.yml (it re-verifies and replaces what changed)"
                         % (host, label, path, "; ".join(stale[:5]), " ..." if len(stale) > 5 else ""))
        if stale:
            spec["_staged"].pop(path)
    names = set(os.listdir(path))
    if "config.json" not in names:
        probs.append("%s: %s model directory %s has no config.json; expected a Hugging Face model directory"
                     % (host, label, path))
    if not names & set(TOKENIZER_FILES):
        probs.append("%s: %s model directory %s has no tokenizer file (expected one of %s)"
                     % (host, label, path, ", ".join(TOKENIZER_FILES)))
    total = None
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as fh:
                idx = json.load(fh)
        except (OSError, ValueError) as exc:
            probs.append("%s: %s index %s unreadable: %s" % (host, label, index, exc))
            idx = {}
        shards = sorted(set((idx.get("weight_map") or {}).values()))
        missing = [s for s in shards if not os.path.isfile(os.path.join(path, s))]
        if missing:
            probs.append("%s: %s model directory %s lacks %d of the %d shards its index lists (%s%s); fix: copy the "
                         "missing files" % (host, label, path, len(missing), len(shards), ", ".join(missing[:5]),
                                            " ..." if len(missing) > 5 else ""))
        total = sum(os.path.getsize(os.path.join(path, s)) for s in shards if s not in missing)
        want = (idx.get("metadata") or {}).get("total_size")
        tol = float(spec.get("size_tolerance_pct", 5))
        # total_size counts tensor bytes; each shard adds a small header, so the files are slightly larger
        if want and not missing and not (want * (1 - tol / 100) <= total <= want * (1 + tol / 100)):
            probs.append("%s: %s shards in %s total %d bytes, the index says %d (tolerance %s%%): truncated or "
                         "wrong files; fix: copy the weights again and compare checksums" % (
                             host, label, path, total, want, tol))
    elif not any(n.endswith(".safetensors") for n in names):
        probs.append("%s: %s model directory %s has neither model.safetensors.index.json nor *.safetensors"
                     % (host, label, path))
    else:
        total = sum(os.path.getsize(os.path.join(path, n)) for n in names if n.endswith(".safetensors"))
    for sub in sorted(names):
        full = os.path.join(path, sub)
        why = readable_problem(full, uid, gids, user)
        if why:
            probs.append("%s: %s model: %s; the workers run as %s; fix: chmod -R a+rX %s (or chown to %s)"
                         % (host, label, why, user, path, user))
            break
    return probs, total


def host_addresses():
    addrs = set()
    try:
        out = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True, timeout=10,
                             check=False).stdout
        addrs |= {m.split("/")[0] for m in re.findall(r"\binet6?\s+(\S+)", out)}
    except (OSError, subprocess.TimeoutExpired):
        pass
    if not addrs:
        try:
            out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10, check=False).stdout
            addrs |= set(out.split())
        except (OSError, subprocess.TimeoutExpired):
            pass
    return addrs


def meminfo_bytes(path="/proc/meminfo"):
    with open(path) as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return None


def hicache_need(instances, gpu_mem_bytes, weights_bytes):
    """[(id, bytes)] of host memory the hierarchical cache of each instance needs: per rank R x its KV pool, the
    pool ~ mem_fraction_static x GPU memory minus the rank's share of the weights."""
    out = []
    for inst in instances:
        args = inst.get("args") or []
        if arg_value(args, "--enable-hierarchical-cache") is None:
            continue
        if arg_value(args, "--hicache-size") not in (None, "0", True):
            size_gb = float(arg_value(args, "--hicache-size"))
            out.append((inst["id"], int(size_gb * GIB) * max(1, len(inst.get("gpus") or [1]))))
            continue
        ratio = float(arg_value(args, "--hicache-ratio") or 2.0)
        frac = float(arg_value(args, "--mem-fraction-static") or 0.9)
        ranks = max(1, len(inst.get("gpus") or []))
        share = (weights_bytes.get(arg_value(args, "--model-path")) or 0) / ranks
        pool = max(0.0, frac * gpu_mem_bytes - share)
        out.append((inst["id"], int(ratio * pool * ranks)))
    return out


def check(spec, meminfo="/proc/meminfo"):
    host = spec.get("host") or os.uname().nodename
    problems, facts = [], {}
    uid, gids = user_ids(spec.get("user") or "sglang", spec.get("group"))
    weights = {}
    if spec.get("model_check", True):
        seen = set()
        for inst in spec.get("instances") or []:
            args = inst.get("args") or []
            for flag, label in (("--model-path", "%s" % inst["id"]),
                                ("--speculative-draft-model-path", "%s draft" % inst["id"])):
                path = arg_value(args, flag)
                if not isinstance(path, str) or path in seen:
                    continue
                seen.add(path)
                probs, total = check_model(host, label, path, spec, uid, gids)
                problems += probs
                weights[path] = total
        staged = spec.get("_staged") or {}
        by_marker = facts.setdefault("verified_by_marker", [])
        for path, want in sorted((spec.get("manifest") or {}).items()):
            if not os.path.isfile(path):
                if not spec.get("deferred"):
                    problems.append("%s: manifest file %s is missing (sglang_model_manifest)" % (host, path))
                continue
            top = next((d for d in staged if path.startswith(d.rstrip("/") + "/")), None)
            rec = (staged[top].get("files") or {}).get(path[len(top.rstrip("/")) + 1:]) if top else None
            if rec and spec.get("verify", "marker") != "full":
                if rec.get("sha256") != str(want).lower():
                    problems.append("%s: %s was staged with sha256 %s (its stage marker), sglang_model_manifest says "
                                    "%s; fix: stage the model the manifest pins (playbooks/weights.yml with its "
                                    "manifest) or correct sglang_model_manifest" % (host, path, rec.get("sha256"), want))
                else:
                    by_marker.append(path)
                continue
            got = sha256(path)
            if got != str(want).lower():
                problems.append("%s: %s sha256 %s, the manifest says %s; fix: copy the file again"
                                % (host, path, got, want))
    facts["weights_bytes"] = weights
    facts["staged"] = {p: {"manifest_sha256": m.get("manifest_sha256"), "staged_at": m.get("staged_at"),
                           "files": len(m.get("files") or {})} for p, m in (spec.get("_staged") or {}).items()}
    spec.pop("_staged", None)
    if spec.get("memory_check", True) and spec.get("gpu_memory_mib"):
        need = hicache_need(spec.get("instances") or [], int(spec["gpu_memory_mib"]) * 1024 * 1024, weights)
        if need:
            total = meminfo_bytes(meminfo)
            reserve = float(spec.get("memory_reserve_gib", 64)) * GIB
            sum_need = sum(n for _i, n in need)
            facts.update(hicache_bytes=dict(need), mem_total_bytes=total)
            if total is not None and sum_need + reserve > total:
                problems.append(
                    "%s: host memory %.0f GiB (MemTotal) is less than the hierarchical cache needs: %s = %.0f GiB, plus "
                    "%.0f GiB for the OS and the processes (sglang_host_memory_reserve_gib); each rank allocates "
                    "--hicache-ratio x its KV pool (mem_fraction_static x %.0f GiB GPU memory minus its weight share); "
                    "fix: lower --hicache-ratio or set --hicache-size in the profile, or add memory" % (
                        host, total / GIB, " + ".join("%s %.0f GiB" % (i, n / GIB) for i, n in need), sum_need / GIB,
                        reserve / GIB, int(spec["gpu_memory_mib"]) / 1024.0))
    for path in spec.get("disk_paths") or []:
        probe = path
        while probe and not os.path.exists(probe):
            probe = os.path.dirname(probe)
        st = os.statvfs(probe or "/")
        free = st.f_bavail * st.f_frsize
        want = float(spec.get("disk_min_free_gib", 30)) * GIB
        facts.setdefault("disk_free_bytes", {})[path] = free
        if free < want:
            problems.append("%s: %.1f GiB free on the filesystem of %s (%s), expected at least %.0f GiB for the venvs, "
                            "kernel caches and logs (sglang_disk_min_free_gib); fix: free space or move %s"
                            % (host, free / GIB, path, probe, want / GIB, path))
    adv = spec.get("advertise_address")
    if adv:
        addrs = host_addresses()
        facts["addresses"] = sorted(addrs)
        if adv.startswith("127.") or adv in ("::1", "localhost"):
            problems.append("%s: sglang_advertise_address %s is a loopback address; the other host cannot reach the PD "
                            "bootstrap, the Mooncake handshake or the router's worker URLs there; fix: set it to this "
                            "host's data-network address" % (host, adv))
        elif addrs and adv not in addrs:
            problems.append("%s: sglang_advertise_address %s is not an address of this host (found: %s); fix: set it "
                            "to one of them, on the data network the other host reaches" % (
                                host, adv, ", ".join(sorted(a for a in addrs if not a.startswith("127.")))))
    return {"ok": not problems, "problems": problems, "facts": facts}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    spec = json.loads(argv[0]) if argv else json.load(sys.stdin)
    res = check(spec)
    print(json.dumps(res))
    return 0 if res["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
