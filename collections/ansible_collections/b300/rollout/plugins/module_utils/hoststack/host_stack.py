# -*- coding: utf-8 -*-
"""The NVIDIA + ConnectX host stack (issue 36): parse what a host says, plan what to install/hold/remove, prove it.

Plain stdlib functions, no Ansible imports. The declared stack is data: roles/host_stack/vars/stacks.yml (every value
cited there). The module host_stack_facts gathers the raw texts listed in ``STATE_KEYS``; :func:`plan` says what the
stage would change and whether a reboot follows (or refuses before touching anything); :func:`checks` is the proof
after the run (and what the on-call audit reads): each check has a verdict, what was found, what was expected and
the fix.

Formats parsed (real examples: tests/fixtures/real-world/host_stack/SOURCES.md):
  * ``/proc/driver/nvidia/version`` - open flavour ``NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  <ver>``,
    proprietary ``NVRM version: NVIDIA UNIX x86_64 Kernel Module  <ver>`` (nixGL #186, rootpages #812)
  * ``nvidia-smi -q`` - ``Driver Version``, per GPU ``Persistence Mode`` and the ``Fabric`` block (State, Status,
    CliqueId, ClusterUUID, Health/Summary)
  * the fabric manager's journal (``journalctl -u nvidia-fabricmanager``): start-script and nv-fabricmanager lines
  * ``dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'``, ``apt-mark showhold``,
    ``apt-cache policy <pkgs>``, ``apt-config dump``, ``/proc/modules``, ``mokutil --sb-state``
"""
from __future__ import annotations

import re

from ansible_collections.b300.rollout.plugins.module_utils.hw.gpu_topology import parse_nvlink_status

STATE_KEYS = ("dpkg", "holds", "proc_modules", "proc_version", "smi_q", "fm_journal", "sb_state", "running_kernel",
              "next_kernel", "next_kernel_modules", "kernel_config", "apt_config", "apt_policy", "modules_load",
              "sw_mng_devices", "unattended_upgrades_installed", "nvlink_s")

# --------------------------------------------------------------------------------------------------- parsers
PROC_OPEN_RE = re.compile(r"NVRM version: NVIDIA UNIX Open Kernel Module for (\S+)\s+(\d+\.\d+(?:\.\d+)?)\s")
PROC_PROP_RE = re.compile(r"NVRM version: NVIDIA UNIX (\S+) Kernel Module\s+(\d+\.\d+(?:\.\d+)?)?")


def parse_proc_version(text):
    """``/proc/driver/nvidia/version`` -> {flavour: open|proprietary|None, version, arch}; None when no driver."""
    if not text or "NVRM version" not in text:
        return None
    m = PROC_OPEN_RE.search(text + " ")
    if m:
        return {"flavour": "open", "version": m.group(2), "arch": m.group(1)}
    m = PROC_PROP_RE.search(text)
    if m:
        return {"flavour": "proprietary", "version": m.group(2), "arch": m.group(1)}
    return {"flavour": None, "version": None, "arch": None}


def _kv(line):
    if ":" not in line:
        return None, None
    k, v = line.split(":", 1)
    return k.strip(), v.strip()


def parse_smi_q(text):
    """``nvidia-smi -q`` (whole or a Fabric fragment) -> {driver_version, gpus: [{bus_id, persistence, fabric}]}.

    A text without ``GPU <bus id>`` headers (a grep'd Fabric fragment) is read as one GPU with bus_id None.
    fabric: {state, status, clique_id, cluster_uuid, health_summary} as printed (``N/A`` kept).
    """
    out = {"driver_version": None, "gpus": []}
    gpu = None
    in_fabric = in_health = False
    fabric_indent = None
    for raw in (text or "").splitlines():
        line = raw.rstrip()
        if not line.strip() or line.strip() == "--":
            continue
        indent = len(line) - len(line.lstrip())
        k, v = _kv(line)
        if k == "Driver Version" and indent == 0:
            out["driver_version"] = v
            continue
        m = re.match(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)\s*$", line)
        if m:
            gpu = {"bus_id": m.group(1), "persistence": None, "fabric": None}
            out["gpus"].append(gpu)
            in_fabric = in_health = False
            continue
        if line.strip() == "Fabric":
            if gpu is None:
                gpu = {"bus_id": None, "persistence": None, "fabric": None}
                out["gpus"].append(gpu)
            gpu["fabric"] = {"state": None, "status": None, "clique_id": None, "cluster_uuid": None,
                             "health_summary": None}
            in_fabric, in_health, fabric_indent = True, False, indent
            continue
        if in_fabric and indent <= fabric_indent:
            in_fabric = in_health = False
        if gpu is not None and k == "Persistence Mode":
            gpu["persistence"] = v
        if not in_fabric:
            continue
        if line.strip() == "Health":
            in_health = True
            continue
        key = {"State": "state", "Status": "status", "CliqueId": "clique_id", "ClusterUUID": "cluster_uuid"}.get(k)
        if key and not in_health:
            gpu["fabric"][key] = v
        elif in_health and k == "Summary":
            gpu["fabric"]["health_summary"] = v
    return out


FM_SUCCESS_NVL5 = "Successfully configured all the available GPUs and NVSwitches to route NVLink traffic"
FM_SUCCESS_LEGACY = "Successfully configured all the available NVSwitches to route GPU NVLink traffic"
FM_MISMATCH_RE = re.compile(r"fabric manager NVIDIA GPU driver interface version (\S+) do(?:n't|n\u2019t|esn't) match "
                            r"with driver version (\S+?)\.?(?:\s|$)")


def parse_fm_journal(text):
    """The fabric manager's (and NVLSM's) journal -> what its last start said.

    Lines: ``Detected Pre-NVL5 system`` / ``Detected NVL5 system`` (the start script's platform detection),
    NV_WARN_NOTHING_TO_DO, the version mismatch message, ``nvlsm does not exist``, the success lines, NVLSM's
    ``Entering MASTER state`` and ``Started "Nvidia NVLink Subnet Manager"`` (host-stack-facts.md, B300 field report).
    """
    t = text or ""
    # only the last start counts (a restart after a fix leaves the failed start of this boot above it): systemd logs
    # "Starting nvidia-fabricmanager.service - NVIDIA fabric manager service..." for each (nvtrust #128's journal)
    last = t.rfind("Starting nvidia-fabricmanager")
    if last >= 0:
        t = t[t.rfind("\n", 0, last) + 1:]
    mm = None
    for m in FM_MISMATCH_RE.finditer(t):
        mm = {"fabric_manager": m.group(1), "driver": m.group(2)}
    return {
        "pre_nvl5": "Detected Pre-NVL5 system" in t,
        "nothing_to_do": "NV_WARN_NOTHING_TO_DO" in t,
        "version_mismatch": mm,
        "nvlsm_missing": bool(re.search(r"nvlsm\S* does not exist", t)),
        "success_nvl5": FM_SUCCESS_NVL5 in t,
        "success_legacy": FM_SUCCESS_LEGACY in t,
        "nvlsm_started": 'Started "Nvidia NVLink Subnet Manager"' in t,
        "nvlsm_master": "Entering MASTER state" in t,
        "failed": bool(re.search(r"nvidia-fabricmanager\.service: (?:Control process exited|Failed with result)", t)),
    }


def parse_dpkg(text):
    """``dpkg-query -W -f '${Package}\\t${Version}\\t${db:Status-Abbrev}\\n'`` -> {name: version} of installed ones
    (status ``ii``/``hi``; ``rc`` = removed, config files left, is not installed)."""
    out = {}
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) < 3:
            continue
        name, version, status = parts[0].split(":")[0], parts[1], parts[2].strip()
        if len(status) >= 2 and status[1] in ("i",) and version:
            out[name] = version
    return out


def parse_dpkg_holds(text):
    """Package names dpkg marks hold (``db:Status-Abbrev`` first letter ``h``: what ``apt-mark hold`` sets), so the
    hold state needs no second command."""
    out = set()
    for line in (text or "").splitlines():
        parts = line.split("\t")
        if len(parts) >= 3 and parts[2].strip().startswith("h"):
            out.add(parts[0].split(":")[0])
    return out


def holds_of(state):
    """Held packages: dpkg's selection state, plus ``apt-mark showhold`` lines when given."""
    return parse_dpkg_holds(state.get("dpkg")) | set(parse_lines(state.get("holds")))


def needs_apt_policy(stack, state):
    """Whether the plan needs ``apt-cache policy`` (some stack package not installed at its declared version): a host
    that already has the stack is judged without reading the package lists at all."""
    installed = parse_dpkg(state.get("dpkg"))
    return any(not version_matches(installed.get(p["name"]), p["version"])
               for p in stack_packages(stack, state.get("running_kernel")))


def parse_lines(text):
    return [ln.strip() for ln in (text or "").splitlines() if ln.strip()]


def parse_proc_modules(text):
    """``/proc/modules`` (or lsmod) -> set of loaded module names."""
    names = set()
    for line in (text or "").splitlines():
        f = line.split()
        if f and f[0] != "Module":
            names.add(f[0])
    return names


def parse_sb_state(text):
    """``mokutil --sb-state`` -> True (SecureBoot enabled), False (disabled), None (no EFI / not known)."""
    t = (text or "").lower()
    if "secureboot enabled" in t:
        return True
    if "secureboot disabled" in t:
        return False
    return None


def parse_apt_policy(text):
    """``apt-cache policy <pkgs>`` -> {pkg: {installed, candidate, versions: {version: [source lines]}}}."""
    out = {}
    cur = ver = None
    in_table = False
    for raw in (text or "").splitlines():
        if not raw.strip():
            continue
        if not raw.startswith(" ") and raw.rstrip().endswith(":"):
            cur = {"installed": None, "candidate": None, "versions": {}}
            out[raw.rstrip()[:-1]] = cur
            in_table = False
            continue
        if cur is None:
            continue
        s = raw.strip()
        if s.startswith("Installed:"):
            v = s.split(":", 1)[1].strip()
            cur["installed"] = None if v == "(none)" else v
        elif s.startswith("Candidate:"):
            v = s.split(":", 1)[1].strip()
            cur["candidate"] = None if v == "(none)" else v
        elif s.startswith("Version table:"):
            in_table = True
        elif in_table:
            f = s.replace("***", "").split()
            if len(f) == 2 and f[1].lstrip("-").isdigit() and not f[0].isdigit():
                ver = f[0]
                cur["versions"].setdefault(ver, [])
            elif ver and f and f[0].lstrip("-").isdigit():
                cur["versions"][ver].append(" ".join(f[1:]))
    return out


def parse_apt_config(text):
    """``apt-config dump`` -> {periodic_unattended: str|None, blacklist: [patterns]}."""
    out = {"periodic_unattended": None, "blacklist": []}
    for line in (text or "").splitlines():
        m = re.match(r'^APT::Periodic::Unattended-Upgrade "([^"]*)";', line.strip())
        if m:
            out["periodic_unattended"] = m.group(1)
        m = re.match(r'^Unattended-Upgrade::Package-Blacklist:: "([^"]*)";', line.strip())
        if m:
            out["blacklist"].append(m.group(1))
    return out


def upstream(version):
    """Debian version -> its upstream part: ``1:580.173.02-0ubuntu1`` -> ``580.173.02``."""
    v = (version or "").split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def version_matches(deb_version, declared):
    """A Debian version is the declared one: equal, or the declared upstream with any Debian revision. An empty
    declared version (a package that follows the running kernel's build) accepts any installed version."""
    if not deb_version:
        return False
    if not declared:
        return True
    v = deb_version.split(":", 1)[-1]
    return v == declared or upstream(v) == declared


def _vkey(v):
    return [int(x) if x.isdigit() else x for x in re.split(r"[.\-~+:]", v or "") if x != ""]


# --------------------------------------------------------------------------------------------------- the stack
def stack_packages(stack, kernel):
    """The declared packages in install order: [{name, version, group, reboot}] with ``{kernel}`` filled in."""
    out = []
    for p in stack.get("packages") or []:
        out.append({"name": p["name"].replace("{kernel}", kernel or "UNKNOWN-KERNEL"),
                    "version": (p.get("version") or "").replace("{kernel}", kernel or ""),
                    "group": p.get("group"), "reboot": bool(p.get("reboot")), "hold": p.get("hold", True),
                    "modules": list(p.get("modules") or []), "signed": bool(p.get("signed")),
                    "per_kernel": "{kernel}" in p["name"]})
    return out


def _finding(check, verdict, found, expected, fix, evidence=None):
    return {"check": check, "verdict": verdict, "found": found, "expected": expected, "fix": fix,
            "evidence": evidence}


def next_kernel_findings(stack, state):
    """Before any reboot: the kernel that boots next has its modules, and Secure Boot will load them."""
    out = []
    nk = state.get("next_kernel")
    mods = state.get("next_kernel_modules") or {}
    if not nk:
        return [_finding("next_kernel", "fail", "next boot kernel unknown", "the kernel GRUB boots next",
                         "check /boot/vmlinuz and the GRUB default (grub-editenv list)")]
    missing = [m for m in stack.get("boot_modules") or [] if not (mods.get(m) or {}).get("path")]
    if missing:
        out.append(_finding(
            "next_kernel_modules", "fail",
            "kernel %s has no %s (a DKMS build that failed, or linux-modules-extra / the prebuilt nvidia modules "
            "missing for it)" % (nk, ", ".join(missing)),
            "%s under /lib/modules/%s" % (", ".join(stack.get("boot_modules") or []), nk),
            "install linux-modules-extra-%s and the prebuilt %s for it (or read /var/lib/dkms/*/build/make.log), or "
            "keep booting the running kernel (apt-mark hold the kernel meta-package); do not reboot until fixed" % (
                nk, stack.get("prebuilt_modules_package", "nvidia kernel modules")),
            evidence={m: mods.get(m) for m in stack.get("boot_modules") or []}))
    sb = parse_sb_state(state.get("sb_state"))
    if sb:
        unsigned = sorted(m for m, info in mods.items() if info and info.get("path") and not info.get("signer"))
        if unsigned:
            out.append(_finding(
                "secure_boot_signed", "fail",
                "Secure Boot enabled and %s for kernel %s unsigned (the kernel rejects them: 'Loading of unsigned "
                "module is rejected')" % (", ".join(unsigned), nk),
                "every module the stack loads signed by a key the firmware trusts",
                "use the distribution's signed prebuilt modules (%s) instead of DKMS, or enrol a MOK by hand at the "
                "console (mokutil --import; never by automation)" % stack.get("prebuilt_modules_package", "prebuilt"),
                evidence={"sb_state": (state.get("sb_state") or "").strip(), "unsigned": unsigned}))
    if not out:
        out.append(_finding("next_kernel_modules", "pass", "kernel %s has %s%s" % (
            nk, ", ".join(stack.get("boot_modules") or []), " (signed, Secure Boot on)" if sb else ""),
            "modules present for the next boot", None))
    return out


def _resolve(pkg, policy, sources):
    """The one Debian version to install for a declared package, or (None, reason)."""
    pol = policy.get(pkg["name"])
    if pol is None:
        return None, ("apt knows no package %s (apt-cache policy: nothing), expected it from %s; fix: add that apt source "
                      "(or the offline mirror, host_stack_apt_source_match) and run apt-get update" % (
                          pkg["name"], ", ".join(sources) or "the declared source"))
    matching = {v: srcs for v, srcs in pol["versions"].items() if version_matches(v, pkg["version"])}
    offered = {v: [s for s in srcs if "/var/lib/dpkg/status" not in s] for v, srcs in matching.items()}
    offered = {v: s for v, s in offered.items() if s}
    if sources:
        offered = {v: [s for s in srcs if any(src in s for src in sources)] for v, srcs in offered.items()}
        offered = {v: s for v, s in offered.items() if s}
    if not offered:
        if pol.get("installed") and version_matches(pol["installed"], pkg["version"]):
            return pol["installed"], None
        return None, ("%s %s is not offered by the declared source (%s); offered: %s; fix: serve that version from the "
                      "declared source (or the offline mirror) and run apt-get update" % (
                          pkg["name"], pkg["version"] or "(any)", ", ".join(sources) or "any",
                          ", ".join(sorted(pol["versions"])) or "none"))
    if len(offered) > 1 and not pkg["version"] and pol.get("candidate") in offered:
        return pol["candidate"], None
    if len(offered) > 1:
        return None, ("%s %s is offered in %d builds (%s): two sources, refuse to guess; fix: keep one source for the "
                      "stack (remove or pin away the other in /etc/apt/sources.list.d) and run apt-get update" % (
                          pkg["name"], pkg["version"], len(offered), ", ".join(sorted(offered))))
    return next(iter(offered)), None


def _after_install(pkgs, install, remove, state):
    """The state with the next kernel's modules as they will be after this run: a per-kernel package this run installs
    for the running kernel (``modules`` in stacks.yml) provides its modules (signed when the package is), replacing
    what a removed package (a DKMS build) had built. Only when the next kernel is the running one: a newer kernel
    gets nothing from packages named for the running kernel."""
    nk, kernel = state.get("next_kernel"), state.get("running_kernel")
    names = {i.split("=")[0] for i in install}
    if not names or nk != kernel:
        return state
    mods = dict(state.get("next_kernel_modules") or {})
    dkms_removed = any("dkms" in r for r in remove)
    for p in pkgs:
        if p["per_kernel"] and p["name"] in names:
            for m in p["modules"]:
                old = (mods.get(m) or {}).get("path") or ""
                if "/updates/" in old and not dkms_removed:
                    continue    # a DKMS build under updates/ that stays wins over the package's (depmod's order)
                mods[m] = {"path": "/lib/modules/%s (%s, this run)" % (nk, p["name"]),
                           "signer": "signed package %s" % p["name"] if p["signed"] else None}
    return dict(state, next_kernel_modules=mods)


def plan(stack, state):
    """What the stage would do: {install, hold, unhold, remove, modprobe, restart, acts, reboot, reboot_reasons,
    refusals, notes}; ``acts``: any of the first five is non-empty; ``restart``: the fabric manager's unit when its
    version, NVLSM or the bridge modules change and no reboot follows.

    ``install`` is in the stack's order, ``name=debian-version`` each; ``refusals`` non-empty means nothing may be
    changed (the role asserts before acting).
    """
    kernel = state.get("running_kernel")
    pkgs = stack_packages(stack, kernel)
    installed = parse_dpkg(state.get("dpkg"))
    holds = holds_of(state)
    policy = parse_apt_policy(state.get("apt_policy"))
    sources = stack.get("apt_source_match") or []
    res = {"install": [], "hold": [], "unhold": [], "remove": [], "modprobe": [], "restart": [], "reboot": False,
           "reboot_reasons": [], "refusals": [], "notes": []}
    loaded = parse_proc_modules(state.get("proc_modules"))
    res["modprobe"] = [m for m in stack.get("modules_load_at_boot") or [] if m not in loaded]
    for p in pkgs:
        have = installed.get(p["name"])
        if have and version_matches(have, p["version"]):
            if p["hold"] and p["name"] not in holds:
                res["hold"].append(p["name"])
            continue
        ver, why = _resolve(p, policy, sources)
        if why:
            res["refusals"].append(why)
            continue
        if have and p["name"] in holds:
            res["unhold"].append(p["name"])
        res["install"].append("%s=%s" % (p["name"], ver))
        if p["hold"]:
            res["hold"].append(p["name"])
        if p["reboot"]:
            res["reboot"] = True
            res["reboot_reasons"].append("%s %s -> %s" % (p["name"], have or "absent", ver))
        pol = policy.get(p["name"]) or {}
        newer = [v for v in pol.get("versions", {}) if _vkey(upstream(v)) > _vkey(p["version"])]
        if newer:
            res["notes"].append("%s: a source offers newer %s; the stack installs %s exactly and pins it "
                                "(apt preferences), held" % (p["name"], ", ".join(sorted(newer)), ver))
    for name in sorted(installed):
        for pat in stack.get("conflicting_packages") or []:
            if re.fullmatch(pat, name):
                res["remove"].append(name)
                break
    if res["remove"]:
        res["reboot"] = True
        res["reboot_reasons"].append("remove %s" % ", ".join(res["remove"]))
    running = parse_proc_version(state.get("proc_version"))
    want = stack["driver"]["version"]
    if running and (running["flavour"] != "open" or running["version"] != want):
        res["reboot"] = True
        res["reboot_reasons"].append("running driver %s %s, declared open %s" % (
            running["flavour"], running["version"], want))
    boot_pkgs = [p["name"] for p in pkgs if p["reboot"]]
    if running is None and not res["reboot"] and boot_pkgs and all(
            version_matches(installed.get(n), next(p["version"] for p in pkgs if p["name"] == n)) for n in boot_pkgs):
        # installed by an earlier run that stopped before its reboot (host_stack_reboot=stop, or a reboot that did
        # not come back): the reboot is still owed
        res["reboot"] = True
        res["reboot_reasons"].append("%s installed, no driver loaded: the reboot after the install is pending" %
                                     ", ".join(boot_pkgs))
    for f in next_kernel_findings(stack, _after_install(pkgs, res["install"], res["remove"], state)):
        if f["verdict"] == "fail" and (res["install"] or res["reboot"]):
            # refuse only when the stage would change something that needs the next boot; the proof reports it anyway
            res["refusals"].append("%s: %s; fix: %s" % (f["check"], f["found"], f["fix"]))
    # the fabric manager reads its version, NVLSM and the bridge modules when it starts: a change to any of them that
    # no reboot follows needs a restart of the unit, or the fabric stays where it was (In Progress)
    fm_inputs = [i.split("=")[0] for i in res["install"]
                 if next((p["group"] for p in pkgs if p["name"] == i.split("=")[0]), None) in ("driver", "nvlsm")]
    if stack.get("nvlink5") and not res["reboot"] and (fm_inputs or res["modprobe"]):
        res["restart"] = [stack.get("fabric_manager_service") or "nvidia-fabricmanager"]
        res["notes"].append("restart %s: %s changed without a reboot" % (
            res["restart"][0], ", ".join(fm_inputs + res["modprobe"])))
    res["acts"] = bool(res["install"] or res["remove"] or res["hold"] or res["unhold"] or res["modprobe"])
    return res


# --------------------------------------------------------------------------------------------------- the proof
def _unattended_covered(names, blacklist):
    """Package names that no Unattended-Upgrade::Package-Blacklist pattern (regular expressions, matched from the
    start of the name) covers."""
    bad = []
    for n in names:
        if not any(re.match(p, n) for p in blacklist):
            bad.append(n)
    return bad


def checks(stack, state):
    """The proof: [{check, verdict pass|fail|warn|skip, found, expected, fix, evidence}] in a fixed order: the driver,
    the packages, unattended-upgrades, the kernel modules, the fabric manager / NVLSM / bridge, the fabric, NVLink,
    persistence, the GPUDirect path, the next kernel."""
    kernel = state.get("running_kernel")
    pkgs = stack_packages(stack, kernel)
    pv = parse_proc_version(state.get("proc_version"))
    loaded = parse_proc_modules(state.get("proc_modules"))
    nvl5 = bool(stack.get("nvlink5"))
    out = [_driver_check(stack, state, pv)]
    out += _package_checks(stack, state, pkgs)
    out.append(_unattended_check(state, pkgs))
    out += _module_checks(stack, state, loaded, kernel)
    out += _fabric_manager_checks(state, nvl5)
    out.append(fabric_check(parse_smi_q(state.get("smi_q")), nvl5))
    out.append(nvlink_check(stack, state.get("nvlink_s"), nvl5))
    out.append(persistence_check(parse_smi_q(state.get("smi_q"))))
    out.append(gdr_check(stack, pv, loaded, state.get("kernel_config")))
    out += list(next_kernel_findings(stack, state))
    return out


def _driver_check(stack, state, pv):
    """1. The loaded driver: the open flavour at the declared version (/proc/driver/nvidia/version)."""
    want = stack["driver"]["version"]
    if pv is None:
        return _finding("driver_open_flavour", "fail", "no NVIDIA driver loaded (/proc/driver/nvidia/version "
                        "absent)", "NVIDIA UNIX Open Kernel Module %s" % want,
                        "install the stack (host_stack stage) and reboot")
    if pv["flavour"] != "open":
        return _finding(
            "driver_open_flavour", "fail", "%s kernel module %s" % (pv["flavour"], pv["version"]),
            "Open Kernel Module (Blackwell runs only on the open modules; the proprietary ones fail with "
            "RmInitAdapter failed)", "remove the proprietary nvidia modules/DKMS package, install %s, reboot" % (
                stack.get("prebuilt_modules_package")), evidence=(state.get("proc_version") or "").splitlines()[0])
    if pv["version"] != want:
        return _finding("driver_open_flavour", "fail", "open module %s" % pv["version"], "open module %s" % want,
                        "install the declared driver and reboot (the running module is another version)",
                        evidence=(state.get("proc_version") or "").splitlines()[0])
    return _finding("driver_open_flavour", "pass", "Open Kernel Module %s" % pv["version"], want, None,
                    evidence=(state.get("proc_version") or "").splitlines()[0])


def _package_checks(stack, state, pkgs):
    """2. Every stack package at its declared version, one version across the driver group (driver, fabric manager,
    NSCQ, IMEX), every one held."""
    want = stack["driver"]["version"]
    out = []
    installed = parse_dpkg(state.get("dpkg"))
    holds = holds_of(state)
    wrong = ["%s %s (declared %s)" % (p["name"], installed.get(p["name"]) or "absent", p["version"]) for p in pkgs
             if not version_matches(installed.get(p["name"]), p["version"])]
    fm_pkgs = [p for p in pkgs if p["group"] == "driver"]
    skew = sorted({upstream(installed[p["name"]]) for p in fm_pkgs if installed.get(p["name"])})
    out.append(_finding(
        "packages_declared", "fail" if wrong else "pass", "; ".join(wrong) or "all %d at the declared versions" % len(
            pkgs), "every stack package installed at its declared version",
        "run the host_stack stage (it installs the exact versions from the one declared source)" if wrong else None,
        evidence={p["name"]: installed.get(p["name"]) for p in pkgs}))
    skewed = len(skew) > 1 or (skew and skew != [want])
    out.append(_finding(
        "driver_fm_same_version", "fail" if skewed or not skew else "pass",
        "driver-group versions installed: %s" % (", ".join(skew) or "none (no driver-group package installed)"),
        "driver == fabric manager == NSCQ == IMEX == %s" % want,
        "install every driver-group package at %s from one source and hold them (an unheld fabric manager moved "
        "alone is the #1 fabric manager failure)" % want if skewed or not skew else None))
    unheld = [p["name"] for p in pkgs if p["hold"] and installed.get(p["name"]) and p["name"] not in holds]
    any_installed = any(installed.get(p["name"]) for p in pkgs if p["hold"])
    out.append(_finding("packages_held", "fail" if unheld or not any_installed else "pass",
                        "not held: %s" % ", ".join(unheld) if unheld else (
                            "all held" if any_installed else "none of the stack's packages installed"),
                        "apt-mark hold on every stack package",
                        "apt-mark hold %s" % " ".join(unheld) if unheld else (
                            None if any_installed else "run the host_stack stage")))
    return out


def _unattended_check(state, pkgs):
    """3. unattended-upgrades kept away from the stack's packages (its blacklist), or not active."""
    uu = state.get("unattended_upgrades_installed")
    conf = parse_apt_config(state.get("apt_config"))
    if uu and conf["periodic_unattended"] not in (None, "0"):
        bad = _unattended_covered([p["name"] for p in pkgs], conf["blacklist"])
        return _finding(
            "unattended_upgrades_away", "fail" if bad else "pass",
            "unattended-upgrades active and may upgrade %s" % ", ".join(bad) if bad else
            "unattended-upgrades active, every stack package blacklisted",
            "Unattended-Upgrade::Package-Blacklist covering every stack package",
            "run the host_stack stage (it writes /etc/apt/apt.conf.d/51b300-host-stack-blacklist)" if bad else None,
            evidence={"blacklist": conf["blacklist"]})
    return _finding("unattended_upgrades_away", "pass", "unattended-upgrades not active", "not active or "
                    "blacklisted", None)


def _module_checks(stack, state, loaded, kernel):
    """4. The kernel modules the stack needs loaded now, and listed in /etc/modules-load.d for the next boot."""
    out = []
    need = list(stack.get("loaded_modules") or [])
    miss = [m for m in need if m not in loaded]
    out.append(_finding("modules_loaded", "fail" if miss else "pass",
                        "not loaded: %s" % ", ".join(miss) if miss else "loaded: %s" % ", ".join(need),
                        "loaded: %s (the fabric manager sees the NVSwitch bridge only through mlx5_ib + ib_umad)"
                        % ", ".join(need),
                        "modprobe %s; install linux-modules-extra-%s if modprobe finds none" % (
                            " ".join(miss), kernel) if miss else None))
    at_boot = set()
    for text in (state.get("modules_load") or {}).values():
        at_boot.update(ln.split("#")[0].strip() for ln in (text or "").splitlines() if ln.split("#")[0].strip())
    boot_miss = [m for m in stack.get("modules_load_at_boot") or [] if m not in at_boot]
    out.append(_finding("modules_at_boot", "fail" if boot_miss else "pass",
                        "not in /etc/modules-load.d: %s" % ", ".join(boot_miss) if boot_miss else "in modules-load.d",
                        ", ".join(stack.get("modules_load_at_boot") or []),
                        "run the host_stack stage (it writes /etc/modules-load.d/b300-host-stack.conf)"
                        if boot_miss else None))
    return out


def _fabric_manager_checks(state, nvl5):
    """5. The NVSwitch management bridge (NVLink 5), the fabric manager's journal (its last start) and NVLSM's."""
    out = []
    bridges = state.get("sw_mng_devices") or []
    if nvl5:
        out.append(_finding("sw_mng_bridge", "pass" if bridges else "fail",
                            "SW_MNG bridge: %s" % ", ".join(bridges) if bridges else "no RDMA device with SW_MNG in "
                            "its VPD", "the NVSwitch management bridge (onboard ConnectX-7, VPD SW_MNG) as an mlx5 IB "
                            "device", None if bridges else "load mlx5_ib + ib_umad (linux-modules-extra); check the "
                            "bridge in lspci"))
    j = parse_fm_journal(state.get("fm_journal"))
    if j["version_mismatch"]:
        out.append(_finding("fabric_manager_journal", "fail", "fabric manager %s refuses driver %s" % (
            j["version_mismatch"]["fabric_manager"], j["version_mismatch"]["driver"]), "fabric manager == driver",
            "install nvidia-fabricmanager at the driver's version from the same source and hold both"))
    elif nvl5 and (j["pre_nvl5"] or j["nothing_to_do"]):
        out.append(_finding("fabric_manager_journal", "fail", "fabric manager started on the pre-NVL5 path / "
                            "NV_WARN_NOTHING_TO_DO", "NVL5 start with NVLSM", "load mlx5_ib + ib_umad so the start "
                            "script finds the SW_MNG bridge, install nvlsm, restart nvidia-fabricmanager"))
    elif nvl5 and j["nvlsm_missing"]:
        out.append(_finding("fabric_manager_journal", "fail", "the start script found no nvlsm binary",
                            "nvlsm installed", "install nvlsm (the declared version) and restart the fabric manager"))
    elif (j["success_nvl5"] if nvl5 else (j["success_nvl5"] or j["success_legacy"])):
        out.append(_finding("fabric_manager_journal", "pass", "success line present", "success line", None))
    else:
        out.append(_finding("fabric_manager_journal", "fail", "no success line in the fabric manager's journal",
                            FM_SUCCESS_NVL5 if nvl5 else FM_SUCCESS_LEGACY,
                            "journalctl -u nvidia-fabricmanager -b; systemctl restart nvidia-fabricmanager"))
    if nvl5:
        ok = j["nvlsm_master"]
        out.append(_finding("nvlsm_journal", "pass" if ok else "fail",
                            "NVLSM entered MASTER state" if ok else "no 'Entering MASTER state' from NVLSM",
                            "NVLSM master on the management port", None if ok else
                            "install nvlsm, check ib_umad and the SW_MNG port, restart nvidia-fabricmanager"))
    return out


def fabric_check(smi, nvl5):
    gpus = smi["gpus"]
    if not gpus:
        return _finding("fabric_state", "fail", "nvidia-smi -q lists no GPU", "every GPU Completed/Success",
                        "check the driver (nvidia-smi)")
    bad, ids = [], set()
    for i, g in enumerate(gpus):
        f = g["fabric"] or {}
        name = g["bus_id"] or "GPU %d" % i
        if not nvl5 and f.get("state") in (None, "N/A"):
            continue
        if f.get("state") != "Completed" or f.get("status") != "Success":
            bad.append("%s: State %s, Status %s" % (name, f.get("state"), f.get("status")))
            continue
        if f.get("health_summary") not in (None, "N/A", "Healthy", "Not Supported"):
            bad.append("%s: Health Summary %s" % (name, f.get("health_summary")))
        ids.add((f.get("cluster_uuid"), f.get("clique_id")))
    if not nvl5 and not bad and not ids:
        return _finding("fabric_state", "skip", "no NVLink fabric on this host (Fabric N/A on every GPU)",
                        "NVLink 5 platforms only", None)
    if bad:
        return _finding("fabric_state", "fail", "; ".join(bad), "every GPU State Completed, Status Success, Health "
                        "Healthy (In Progress = the fabric never registered: CUDA error 802)",
                        "check the fabric manager and NVLSM journal (fabric_manager_journal, nvlsm_journal), then "
                        "systemctl restart nvidia-fabricmanager")
    if len(ids) > 1:
        return _finding("fabric_state", "fail", "GPUs in %d cliques: %s" % (len(ids), sorted(ids)),
                        "one shared ClusterUUID/CliqueId", "restart nvidia-fabricmanager; reset the GPUs if it stays")
    (uuid, clique), = ids
    return _finding("fabric_state", "pass", "%d GPUs Completed/Success, ClusterUUID %s, CliqueId %s" % (
        len(gpus), uuid, clique), "every GPU Completed/Success in one clique", None)


def nvlink_check(stack, nvlink_s, nvl5):
    """``nvidia-smi nvlink -s`` (parsed by gpu_topology.parse_nvlink_status): every GPU has the declared number of
    links up at the declared speed (HGX B300: 18 x 53.125 GB/s, host-stack-facts.md Addenda)."""
    want = stack.get("nvlink") or {}
    links = parse_nvlink_status(nvlink_s)
    if not nvl5:
        return _finding("nvlink_speed", "skip", "not an NVLink 5 platform", "NVLink 5 platforms only", None)
    if not links:
        return _finding("nvlink_speed", "fail", "nvidia-smi nvlink -s printed no GPU", "%s links x %s GB/s per GPU" % (
            want.get("links_per_gpu"), want.get("link_gbps")), "check the driver and the fabric (fabric_state)")
    bad = []
    for gpu, per in sorted(links.items()):
        up = [s for s in per.values() if s is not None and s >= float(want.get("link_gbps") or 0)]
        if len(up) < int(want.get("links_per_gpu") or 0):
            bad.append("GPU %d: %d of %d links at >= %s GB/s (%s)" % (
                gpu, len(up), len(per), want.get("link_gbps"),
                ", ".join(sorted({"%s" % ("inactive" if s is None else s) for s in per.values()}))))
    return _finding("nvlink_speed", "fail" if bad else "pass",
                    "; ".join(bad) if bad else "%d GPUs x %s links at %s GB/s" % (
                        len(links), want.get("links_per_gpu"), want.get("link_gbps")),
                    "%s links x %s GB/s per GPU" % (want.get("links_per_gpu"), want.get("link_gbps")),
                    "nvidia-smi nvlink -e for errors; reset the GPU or reseat/replace (a link down is hardware)"
                    if bad else None)


def persistence_check(smi):
    off = [g["bus_id"] or str(i) for i, g in enumerate(smi["gpus"]) if g["persistence"] != "Enabled"]
    if not smi["gpus"]:
        return _finding("persistence", "fail", "no GPU", "Persistence Mode Enabled", "check the driver")
    return _finding("persistence", "fail" if off else "pass",
                    "Persistence Mode not Enabled on %s" % ", ".join(off) if off else "Enabled on every GPU",
                    "Enabled on every GPU", "systemctl enable --now nvidia-persistenced" if off else None)


def gdr_path(stack, proc_version, loaded, kernel_config):
    """Which GPUDirect RDMA path NCCL will have, and why: ``dma_buf`` (open modules + CONFIG_PCI_P2PDMA, NVIDIA's
    recommendation), ``nvidia_peermem`` (module loaded: needs MOFED/DOCA's peer-memory API), or None."""
    p2p = bool(re.search(r"^CONFIG_PCI_P2PDMA=y$", kernel_config or "", re.M))
    if proc_version and proc_version.get("flavour") == "open" and p2p:
        return "dma_buf", "open kernel modules and CONFIG_PCI_P2PDMA=y"
    if "nvidia_peermem" in loaded:
        return "nvidia_peermem", "nvidia_peermem loaded (%s)" % (
            "kernel without CONFIG_PCI_P2PDMA" if not p2p else "proprietary modules")
    return None, "neither: %s, nvidia_peermem not loaded" % (
        "CONFIG_PCI_P2PDMA missing" if not p2p else "proprietary modules")


def gdr_check(stack, proc_version, loaded, kernel_config):
    path, why = gdr_path(stack, proc_version, loaded, kernel_config)
    declared = (stack.get("gdr") or {}).get("path")
    if path is None:
        return _finding("gdr_path", "fail", why, "GPUDirect RDMA by %s" % declared,
                        "boot a kernel with CONFIG_PCI_P2PDMA=y on the open modules (DMA-BUF), or modprobe "
                        "nvidia_peermem with DOCA-OFED")
    if path != declared:
        return _finding("gdr_path", "warn", "%s (%s)" % (path, why), declared,
                        "the declared path is %s: see roles/host_stack/vars/stacks.yml gdr.rule" % declared)
    return _finding("gdr_path", "pass", "%s (%s)" % (path, why), declared, None)


def summary(results):
    """One line per check: ``check | verdict | found``."""
    return ["%s | %s | %s" % (r["check"], r["verdict"], r["found"]) for r in results]


def failures(host, results):
    """One message per failing check: host, check, found, expected, fix."""
    return ["%s: host_stack check %s failed: found %s; expected %s; fix: %s" % (
        host, r["check"], r["found"], r["expected"], r["fix"]) for r in results if r["verdict"] == "fail"]
