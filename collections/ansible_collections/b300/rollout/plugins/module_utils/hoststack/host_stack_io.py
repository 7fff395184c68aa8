# -*- coding: utf-8 -*-
"""Gather the raw texts module_utils/hoststack/host_stack.py judges (keys: host_stack.STATE_KEYS). Plain stdlib.

The caller gives ``run(argv) -> stdout`` ('' when the tool is missing or fails) and ``find(name, extra_dirs) -> path``
(the module: AnsibleModule.run_command and tools.find_tool; tools/device/host_stack_run.py: subprocess), so the same
reading runs under Ansible and on the lent GPU machine without it. Read-only: nothing here writes.
"""
from __future__ import annotations

import glob
import gzip
import os
import platform

from ansible_collections.b300.rollout.plugins.module_utils.common.host_lock import proc_start
from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack as hs
from ansible_collections.b300.rollout.plugins.module_utils.hw.rdma_nic import vpd_is_sw_mng


def _read(path):
    try:
        with open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return ""


def read_text(root, path):
    """The text of ``path`` under ``root``, or None when absent or unreadable (a file the caller may have to write)."""
    try:
        with open(os.path.join(root, path.lstrip("/"))) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def _read_gz(path):
    try:
        with gzip.open(path, "rt") as fh:
            return fh.read()
    except (OSError, EOFError, UnicodeDecodeError):
        return ""


def boot_age_s(root="/"):
    """Seconds since this host (or container: the sandbox's hosts) booted: /proc/uptime minus the start of PID 1
    (field 22 of /proc/1/stat, in clock ticks after the kernel's boot; about 1 s on a real host, the container's start
    in the sandbox), read from the real <root>/proc, not the emulated one. None when unreadable. The proof waits for
    the fabric when the host booted less than host_stack_fabric_wait_s ago (the fabric is In Progress for minutes
    after a boot, whoever rebooted it)."""
    start_ticks = proc_start(1, os.path.join(root, "proc"))  # the host lock's reader of /proc/PID/stat field 22
    try:
        uptime = float(_read(os.path.join(root, "proc", "uptime")).split()[0])
        return max(0.0, uptime - float(start_ticks) / os.sysconf("SC_CLK_TCK"))
    except (TypeError, ValueError, IndexError):
        return None


def _kernel_key(release):
    return [int(x) if x.isdigit() else x for x in release.replace("-", ".").split(".")]


def gather(run, find, stack, root="/", bin_path=(), sysfs_root="/sys", proc_root=None):
    """The host's state as texts. ``next_kernel``: the newest /boot/vmlinuz-* (GRUB's default on Ubuntu/Debian),
    else the running kernel. The journal: this boot's last 20000 lines of the fabric manager's unit (its start script
    also runs NVLSM, whose lines land there; ``nvidia-nvlsm`` is read too where a separate unit exists); a chattier
    fabric manager pushes the start's success line out and the check fails saying so, never passes blind.
    ``proc_root``: where ``modules`` and ``driver/nvidia/version`` are read (default <root>/proc; the sandbox's
    emulated driver writes its own, sandbox/hwemu/hoststack.py); modinfo and mokutil are looked up in bin_path first."""
    def r(*parts):
        return os.path.join(root, *parts)

    def tool(name, extra=()):
        return find(name, list(extra))

    proc = proc_root or r("proc")

    running = platform.release()
    kernels = sorted((os.path.basename(p)[len("vmlinuz-"):] for p in glob.glob(r("boot", "vmlinuz-*"))),
                     key=_kernel_key)
    nxt = kernels[-1] if kernels else running
    names = [p["name"] for p in hs.stack_packages(stack, running)]
    dpkg = run([tool("dpkg-query"), "-W", "-f", "${Package}\t${Version}\t${db:Status-Abbrev}\n"])
    # holds come from dpkg's own selection state (first letter h); apt-cache policy (1-2 s: it reads every package
    # list) only when a stack package is missing or at another version
    policy = run([tool("apt-cache"), "policy"] + names) if hs.needs_apt_policy(
        stack, {"dpkg": dpkg, "running_kernel": running}) else ""
    mods = {}
    modinfo = tool("modinfo", bin_path)
    for m in stack.get("boot_modules") or []:
        fn = run([modinfo, "-k", nxt, "-F", "filename", m]).strip()
        signer = run([modinfo, "-k", nxt, "-F", "signer", m]).strip() if fn else ""
        mods[m] = {"path": fn or None, "signer": signer or None}
    load = {}
    for p in sorted(glob.glob(r("etc", "modules-load.d", "*.conf"))):
        load[os.path.basename(p)] = _read(p)
    ib = os.path.join(sysfs_root, "class", "infiniband")
    bridges = sorted(d for d in (os.listdir(ib) if os.path.isdir(ib) else [])
                     if vpd_is_sw_mng(os.path.join(ib, d, "device")))
    return {
        "dpkg": dpkg,
        "holds": "",
        "apt_policy": policy,
        "apt_config": run([tool("apt-config"), "dump"]),
        "proc_modules": _read(os.path.join(proc, "modules")),
        "proc_version": _read(os.path.join(proc, "driver", "nvidia", "version")),
        "smi_q": run([tool("nvidia-smi", bin_path), "-q"]),
        "nvlink_s": run([tool("nvidia-smi", bin_path), "nvlink", "-s"]),
        "fm_journal": run([tool("journalctl"), "-b", "--no-pager", "-o", "short", "-n", "20000", "-u",
                           "nvidia-fabricmanager", "-u", "nvidia-nvlsm"]),
        "sb_state": run([tool("mokutil", bin_path), "--sb-state"]),
        "running_kernel": running, "next_kernel": nxt, "next_kernel_modules": mods,
        # the next kernel's config; for the running kernel without one in /boot, its own /proc/config.gz
        "kernel_config": _read(r("boot", "config-%s" % nxt)) or (
            _read_gz(os.path.join(proc, "config.gz")) if nxt == running else ""),
        "modules_load": load, "sw_mng_devices": bridges,
        "unattended_upgrades_installed": "unattended-upgrades" in hs.parse_dpkg(dpkg),
    }


def report(stack, state, host):
    """The ``host_stack`` fact: plan, checks, summary, failures and the few state values a person reads first."""
    results = hs.checks(stack, state)
    return {
        "plan": hs.plan(stack, state), "checks": results, "summary": hs.summary(results),
        "verdicts": {r["check"]: r["verdict"] for r in results},
        "failures": hs.failures(host, results),
        "running_kernel": state["running_kernel"], "next_kernel": state["next_kernel"],
        "secure_boot": hs.parse_sb_state(state["sb_state"]), "sw_mng_devices": state["sw_mng_devices"],
    }
