# -*- coding: utf-8 -*-
"""Preflight decisions and messages of roles/sglang, in plain Python (unit tests: tests/unit/test_sglang_checks.py).

- ``reach_paths``: every TCP path the profile needs between the hosts of a play (router host -> every worker port,
  decode host -> every prefill bootstrap port); ``listen_specs``: what the short-lived listener of one host binds;
  ``reach_blocked``: one message per path that did not connect, with the firewall rule that would open it;
- ``boot_problems``: the GPU boot services not enabled and the GPUs without persistence mode, with the fix;
- ``script_problems``: the ``problems`` list a role script (files/sglang_host_check.py, sglang_venv_check.py)
  printed as JSON, or its stderr when it printed none;
- ``smoke_empty``: which smoke chat completions answered 200 without text (content, or reasoning_content while a
  reasoning model is still thinking).
"""

from __future__ import absolute_import, division, print_function

import json

__metaclass__ = type

ENABLED_STATES = ("enabled", "enabled-runtime", "static", "alias")


def reach_paths(plan, play_hosts):
    """[{src, dst, address, port, what}] for the hosts of this play only (a host outside the play is not reached)."""
    play = set(play_hosts)
    router = plan.get("router") or {}
    rhost = router.get("host") or ""
    out = []
    if rhost in play:
        for i in plan.get("instances", []):
            if i["host"] in play:
                out.append({"src": rhost, "dst": i["host"], "address": i["address"], "port": int(i["port"]),
                            "what": "router -> worker %s port" % i["id"]})
    dhosts = []
    for i in plan.get("instances", []):
        if i["role"] == "decode" and i["host"] not in dhosts:
            dhosts.append(i["host"])
    for p in plan.get("instances", []):
        if p["role"] != "prefill" or not p.get("bootstrap_port") or p["host"] not in play:
            continue
        for d in dhosts:
            if d in play:
                out.append({"src": d, "dst": p["host"], "address": p["address"], "port": int(p["bootstrap_port"]),
                            "what": "decode host -> prefill %s bootstrap port" % p["id"]})
    return out


def listen_specs(paths, host):
    """The listener's arguments on host: each port a path ends at, once (it counts no connections: the role stops it)."""
    return [str(port) for port in dict.fromkeys(p["port"] for p in paths if p["dst"] == host)]


def reach_blocked(results, source_addresses, connect_s):
    """Messages for the wait_for results (loop items = reach_paths entries) that did not connect. source_addresses:
    {host: the address it connects from (its advertise address)}."""
    out = []
    for r in results or []:
        if "msg" not in r or r.get("skipped"):
            continue
        p = r["item"]
        saddr = source_addresses.get(p["src"], p["src"])
        out.append("%s -> %s (%s) tcp port %s (%s): no connection within %s s (%s); expected it open from %s (%s). "
                   "Likely a firewall on %s: nft add rule inet filter input ip saddr %s tcp dport %s accept (ufw: ufw "
                   "allow from %s to any port %s proto tcp), or a wrong sglang_advertise_address for %s"
                   % (p["src"], p["dst"], p["address"], p["port"], p["what"], connect_s, r["msg"], p["src"], saddr,
                      p["dst"], saddr, p["port"], saddr, p["port"], p["dst"]))
    return out


def boot_problems(host, services, enabled_results, persistence):
    """'' when every GPU boot service is enabled and every GPU has persistence mode on, else the failure message.
    enabled_results: loop results of ``systemctl is-enabled SERVICE`` (item, stdout); persistence: the result of
    ``nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader`` (rc, stdout, stderr)."""
    not_enabled = ["%s not enabled" % r["item"] for r in enabled_results or []
                   if (r.get("stdout") or "").strip() not in ENABLED_STATES]
    if persistence.get("rc", 1) != 0:
        pers = "unreadable: %s" % (persistence.get("stderr") or "").strip()
    else:
        off = [line.split(",")[0].strip() for line in (persistence.get("stdout") or "").splitlines()
               if line.strip() and "Enabled" not in line]
        pers = ("off on GPU " + ", ".join(off)) if off else ""
    if not not_enabled and not pers:
        return ""
    return ("%s: reboot readiness: found %s; persistence mode %s; expected every one of %s enabled and persistence "
            "mode Enabled on every GPU (the workers start at boot only after them; CUDA fails with error 802 before "
            "the fabric is up). Fix: systemctl enable --now %s (persistence follows nvidia-persistenced; or "
            "nvidia-smi -pm 1)" % (host, ", ".join(not_enabled) or "services enabled", pers or "on",
                                   ", ".join(services), " ".join(services)))


def script_problems(result, host, script):
    """The problems a role script reported (its JSON line's 'problems'), else its stderr, joined by ' || '."""
    try:
        data = json.loads(result.get("stdout") or "{}")
    except ValueError:
        data = {}
    problems = data.get("problems") if isinstance(data, dict) else None
    if problems:
        return " || ".join(str(p) for p in problems)
    why = (result.get("stderr") or result.get("msg") or "no output").strip()
    return "%s: %s failed: %s" % (host, script, why)


def smoke_empty(results):
    """1-based numbers of the smoke requests whose answer has neither content nor reasoning_content."""
    out = []
    for n, r in enumerate(results or [], 1):
        try:
            msg = r["json"]["choices"][0]["message"] or {}
        except (KeyError, IndexError, TypeError):
            msg = {}
        if not (msg.get("content") or msg.get("reasoning_content")):
            out.append(n)
    return out


def smoke_text(results):
    """(text, reasoning?) of the first smoke answer."""
    try:
        msg = results[0]["json"]["choices"][0]["message"] or {}
    except (KeyError, IndexError, TypeError):
        return "", False
    if msg.get("content"):
        return msg["content"], False
    return msg.get("reasoning_content") or "", True


def flag_value(args, flags):
    """The value after the first of flags found in an argv list ('' when none is there or it has no value)."""
    for flag in flags:
        if flag in args:
            i = args.index(flag)
            return str(args[i + 1]) if i + 1 < len(args) else ""
    return ""
