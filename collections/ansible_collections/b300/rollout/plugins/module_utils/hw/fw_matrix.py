# -*- coding: utf-8 -*-
"""NIC firmware <-> mlx5 driver compatibility matrix: validation, verdicts, fleet audit reports.

Plain stdlib functions (no Ansible imports) so that modules, tools and tests share them.

Matrix row (one per driver release)::

    id: doca-3.2-ofed-25.10-1.2.2          # unique
    release: "DOCA 3.2.x = DOCA-OFED 25.10-1.2.2"   # free text (optional)
    source: "network-operator firmware map"          # where the pairing comes from (required)
    driver:                                  # which installed drivers this row describes
      flavours: [doca_ofed]                  # rdma_nics.driver.flavour values
      versions: ["25.10-1.2.2"]              # exact driver versions (legacy 25.10-1.2.2 or new 2607.0.100 scheme)
      yymm: ["26.07"]                        # any release of that year.month, in either scheme
      yymm_before: "25.01"                   # any release older than that year.month
      any_version: true                      # every version of these flavours (catch-all)
      doca_release: "3.0.0"                  # informational only (facts do not carry the DOCA release)
    models:
      ConnectX-8: {exact: "40.47.1026", minimum: "40.47.1026", allowed: ["40.47.1088"]}
      ConnectX-9: {unsupported: "reason"}

A device is judged against the most specific matching row: exact version > yymm > yymm_before/any_version;
among equally specific rows the first one wins (operator rows are put first, and replace a built-in row of
the same id).
"""
from __future__ import absolute_import, division, print_function

import re

__metaclass__ = type

KNOWN_FLAVOURS = ("doca_ofed", "mlnx_ofed", "inbox", "absent")
KNOWN_MODELS = ("ConnectX-7", "ConnectX-8", "ConnectX-9", "BlueField-3", "unknown")
ROW_KEYS = frozenset(("id", "release", "source", "driver", "models", "note", "confidence"))
DRIVER_KEYS = frozenset(("flavours", "versions", "yymm", "yymm_before", "any_version", "doca_release"))
RULE_KEYS = frozenset(("exact", "minimum", "allowed", "unsupported", "note"))
VERDICTS = ("ok", "mismatch", "unsupported", "unknown", "pending_reset", "ignored")
POLICY_DEFAULTS = {"unknown": "fail", "pending_reset": "fail", "ignore_roles": ["fabric_manager"]}
POLICY_CHOICES = ("warn", "fail")

_FW_RE = re.compile(r"^\s*(\d+)\.(\d+)\.(\d+)\b")
_LEGACY_RE = re.compile(r"^(\d{1,2})\.(\d{1,2})-(\d+(?:\.\d+)*)$")  # 25.10-1.2.2, 24.10-1.1.4.0.200, 5.8-1.1.2.1
_NEW_RE = re.compile(r"^(\d{2})(\d{2})\.(\d+)\.(\d+)$")
_YYMM_RE = re.compile(r"^(\d{2})\.(\d{2})$")
_KERNEL_RE = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:[-+].*)?$")
_DRIVER_PREFIXES = ("MLNX_OFED_LINUX-", "OFED-internal-", "DOCA-OFED-", "OFED-")


class MatrixError(ValueError):
    """The matrix data is malformed; the message names the row."""


# --------------------------------------------------------------------------- versions

def parse_fw(version):
    """'40.47.1026' or '40.47.1026 (MT_0000001217)' -> (40, 47, 1026); None when unparsable."""
    if version is None:
        return None
    m = _FW_RE.match(str(version))
    if not m:
        return None
    return tuple(int(x) for x in m.groups())


def fw_str(parsed):
    """(40, 47, 26) -> '40.47.0026' (the kernel prints the subminor with 4 digits)."""
    return "%d.%d.%04d" % parsed


def _strip_driver(raw):
    s = str(raw).strip().rstrip(":").strip()
    for p in _DRIVER_PREFIXES:
        if s.startswith(p):
            s = s[len(p):]
            break
    return s


def _trim(parts):
    parts = list(parts)
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse_driver_version(raw, flavour=None):
    """Normalise a mlx5 driver version.

    Returns {'raw', 'scheme': legacy|yymm|kernel, 'yymm': (yy, mm) or None, 'build': tuple, 'kernel': tuple or None}
    or None when unparsable. Accepts '25.10-1.2.2', '24.10-3.2.5.0', 'MLNX_OFED_LINUX-24.10-3.2.5.0:',
    'OFED-internal-25.10-1.2.2', '2607.0.100' (YYMM.x.y); kernel releases ('6.11.0-1014-nvidia') only for flavour inbox.
    """
    if raw is None:
        return None
    s = _strip_driver(raw)
    if flavour != "inbox":
        m = _LEGACY_RE.match(s)
        if m and 1 <= int(m.group(2)) <= 12:
            return {"raw": str(raw), "scheme": "legacy", "yymm": (int(m.group(1)), int(m.group(2))),
                    "build": _trim(int(x) for x in m.group(3).split(".")), "kernel": None}
        m = _NEW_RE.match(s)
        if m and 1 <= int(m.group(2)) <= 12:
            return {"raw": str(raw), "scheme": "yymm", "yymm": (int(m.group(1)), int(m.group(2))),
                    "build": _trim((int(m.group(3)), int(m.group(4)))), "kernel": None}
    m = _KERNEL_RE.match(s) if flavour == "inbox" else None
    if m:
        k = tuple(int(x) for x in m.groups() if x is not None)
        return {"raw": str(raw), "scheme": "kernel", "yymm": None, "build": k, "kernel": k}
    return None


def parse_yymm(text):
    """'26.07' -> (26, 7); None when malformed."""
    m = _YYMM_RE.match(str(text).strip())
    if not m or not 1 <= int(m.group(2)) <= 12:
        return None
    return (int(m.group(1)), int(m.group(2)))


def same_driver(a, b):
    """Two parsed driver versions denote the same release (same scheme, yymm and build)."""
    return a is not None and b is not None and a["scheme"] == b["scheme"] and a["yymm"] == b["yymm"] \
        and a["build"] == b["build"]


# --------------------------------------------------------------------------- matrix validation

def _row_name(index, row):
    rid = row.get("id") if isinstance(row, dict) else None
    return "matrix row %d (id %r)" % (index, rid) if rid else "matrix row %d" % index


def _check_fw(where, key, value):
    if parse_fw(value) is None or not re.match(r"^\d+\.\d+\.\d+$", str(value).strip()):
        raise MatrixError("%s: %s %r is not a firmware version like 40.47.1026" % (where, key, value))


def validate_rows(rows, origin="matrix"):
    """Check every row; raise MatrixError naming the first bad row. Returns the rows unchanged."""
    if not isinstance(rows, list):
        raise MatrixError("%s: expected a list of rows, got %s" % (origin, type(rows).__name__))
    seen = set()
    for i, row in enumerate(rows):
        name = "%s %s" % (origin, _row_name(i, row))
        if not isinstance(row, dict):
            raise MatrixError("%s: a row must be a mapping, got %s" % (name, type(row).__name__))
        extra = set(row) - ROW_KEYS
        if extra:
            raise MatrixError("%s: unknown keys %s (allowed: %s)" % (name, sorted(extra), sorted(ROW_KEYS)))
        rid = row.get("id")
        if not isinstance(rid, str) or not rid.strip():
            raise MatrixError("%s: 'id' must be a non-empty string" % name)
        if rid in seen:
            raise MatrixError("%s: duplicate id %r" % (name, rid))
        seen.add(rid)
        if not isinstance(row.get("source"), str) or not row["source"].strip():
            raise MatrixError("%s: 'source' (where the pairing comes from) is required" % name)
        drv = row.get("driver")
        if not isinstance(drv, dict):
            raise MatrixError("%s: 'driver' must be a mapping" % name)
        extra = set(drv) - DRIVER_KEYS
        if extra:
            raise MatrixError("%s: unknown driver keys %s (allowed: %s)" % (name, sorted(extra), sorted(DRIVER_KEYS)))
        fl = drv.get("flavours")
        if not isinstance(fl, list) or not fl or any(f not in KNOWN_FLAVOURS for f in fl):
            raise MatrixError("%s: driver.flavours must be a non-empty list of %s, got %r" % (name, list(KNOWN_FLAVOURS), fl))
        versions = drv.get("versions", [])
        if not isinstance(versions, list):
            raise MatrixError("%s: driver.versions must be a list" % name)
        for v in versions:
            if parse_driver_version(v, "inbox" if fl == ["inbox"] else None) is None:
                raise MatrixError("%s: driver version %r is not like 25.10-1.2.2 or 2607.0.100" % (name, v))
        yymm = drv.get("yymm", [])
        if not isinstance(yymm, list) or any(parse_yymm(y) is None for y in yymm):
            raise MatrixError("%s: driver.yymm must be a list of 'YY.MM' strings, got %r" % (name, yymm))
        if "yymm_before" in drv and parse_yymm(drv["yymm_before"]) is None:
            raise MatrixError("%s: driver.yymm_before must be 'YY.MM', got %r" % (name, drv["yymm_before"]))
        if "any_version" in drv and not isinstance(drv["any_version"], bool):
            raise MatrixError("%s: driver.any_version must be true/false" % name)
        if not (versions or yymm or "yymm_before" in drv or drv.get("any_version") or drv.get("doca_release")):
            raise MatrixError("%s: driver needs versions, yymm, yymm_before, any_version or doca_release" % name)
        models = row.get("models")
        if not isinstance(models, dict) or not models:
            raise MatrixError("%s: 'models' must be a non-empty mapping of NIC model -> rule" % name)
        for model, rule in models.items():
            where = "%s model %s" % (name, model)
            if model not in KNOWN_MODELS:
                raise MatrixError("%s: unknown NIC model (known: %s)" % (where, list(KNOWN_MODELS)))
            if not isinstance(rule, dict):
                raise MatrixError("%s: rule must be a mapping with exact/minimum/allowed/unsupported" % where)
            extra = set(rule) - RULE_KEYS
            if extra:
                raise MatrixError("%s: unknown rule keys %s (allowed: %s)" % (where, sorted(extra), sorted(RULE_KEYS)))
            if "unsupported" in rule:
                if not isinstance(rule["unsupported"], str) or not rule["unsupported"].strip():
                    raise MatrixError("%s: 'unsupported' must be a reason string" % where)
                if set(rule) & {"exact", "minimum", "allowed"}:
                    raise MatrixError("%s: 'unsupported' cannot be combined with exact/minimum/allowed" % where)
                continue
            if not set(rule) & {"exact", "minimum", "allowed"}:
                raise MatrixError("%s: needs at least one of exact, minimum, allowed, unsupported" % where)
            for key in ("exact", "minimum"):
                if key in rule:
                    _check_fw(where, key, rule[key])
            allowed = rule.get("allowed", [])
            if not isinstance(allowed, list):
                raise MatrixError("%s: 'allowed' must be a list of firmware versions" % where)
            for a in allowed:
                _check_fw(where, "allowed", a)
    return rows


def merge_rows(base_rows, extra_rows=None):
    """Operator rows first (they win ties); a built-in row whose id an operator row reuses is replaced."""
    extra_rows = list(extra_rows or [])
    validate_rows(extra_rows, origin="nic_firmware_gate_extra_rows")
    validate_rows(base_rows, origin="matrix")
    ids = set(r["id"] for r in extra_rows)
    return extra_rows + [r for r in base_rows if r["id"] not in ids]


def load_matrix_doc(doc):
    """Accept either a list of rows or a mapping with key nic_firmware_gate_matrix_rows / rows."""
    if isinstance(doc, dict):
        for key in ("nic_firmware_gate_matrix_rows", "rows"):
            if key in doc:
                return validate_rows(doc[key])
        raise MatrixError("matrix file: expected a list of rows or a 'nic_firmware_gate_matrix_rows' key")
    return validate_rows(doc)


# --------------------------------------------------------------------------- matching

def _row_specificity(row, flavour, drv):
    """0 = no match, 3 exact version, 2 yymm, 1 yymm_before / any_version."""
    spec = row["driver"]
    if flavour not in spec["flavours"]:
        return 0
    if drv is not None:
        for v in spec.get("versions", []):
            if same_driver(parse_driver_version(v, flavour), drv):
                return 3
        if drv["yymm"] is not None:
            if any(parse_yymm(y) == drv["yymm"] for y in spec.get("yymm", [])):
                return 2
            if "yymm_before" in spec and drv["yymm"] < parse_yymm(spec["yymm_before"]):
                return 1
    if spec.get("any_version"):
        return 1
    return 0


def match_row(rows, flavour, version):
    """Most specific row for (flavour, version); first wins among equals. Returns (row, how) or (None, None)."""
    drv = parse_driver_version(version, flavour)
    best, best_score = None, 0
    for row in rows:
        score = _row_specificity(row, flavour, drv)
        if score > best_score:
            best, best_score = row, score
    how = {3: "driver version", 2: "driver year.month", 1: "driver catch-all"}.get(best_score)
    return best, how


def expected_text(rule):
    """Human form of what a rule accepts: '40.47.1026', '>= 40.50.0394', '40.47.1026 or 40.47.1088'."""
    if "unsupported" in rule:
        return "not supported: " + rule["unsupported"]
    parts = []
    if "exact" in rule:
        parts.append(str(rule["exact"]))
    if "minimum" in rule and rule.get("minimum") != rule.get("exact"):
        parts.append(">= %s" % rule["minimum"])
    parts.extend(str(a) for a in rule.get("allowed", []) if a != rule.get("exact"))
    return " or ".join(parts)


def judge_fw(rule, fw):
    """Apply one model rule to a firmware version. Returns (verdict, rule_name)."""
    if "unsupported" in rule:
        return "unsupported", "unsupported"
    cur = parse_fw(fw)
    if cur is None:
        return "mismatch", "unparsable_fw"
    if "exact" in rule and cur == parse_fw(rule["exact"]):
        return "ok", "exact"
    if any(cur == parse_fw(a) for a in rule.get("allowed", [])):
        return "ok", "allowed"
    if "minimum" in rule:
        if cur >= parse_fw(rule["minimum"]):
            return "ok", "minimum"
        return "mismatch", "minimum"
    return "mismatch", "exact" if "exact" in rule else "allowed"


def normalise_policy(policy):
    out = dict(POLICY_DEFAULTS)
    for k, v in (policy or {}).items():
        if v is None:
            continue
        if k in ("unknown", "pending_reset"):
            if v not in POLICY_CHOICES:
                raise ValueError("policy %s must be one of %s, got %r" % (k, list(POLICY_CHOICES), v))
            out[k] = v
        elif k == "ignore_roles":
            out[k] = list(v)
        else:
            raise ValueError("unknown policy key %r (known: %s)" % (k, sorted(POLICY_DEFAULTS)))
    return out


def remediation(device, expected_fw):
    pci = device.get("pci_address") or device.get("name")
    image = "<fw image for PSID %s, version %s>" % (device.get("psid") or "?", expected_fw or "?")
    return ("tools/fw-update -l <host> (playbooks/nic_firmware_update.yml: the image {img} listed in "
            "nic_firmware_update_images, checked, burned, activated and verified one host at a time; the gate itself "
            "never flashes); by hand, in a maintenance window: "
            "mlxfwmanager -d {pci} -u -i {img}  (or: flint -d {pci} -i <fw.bin> burn), "
            "then mlxfwreset -d {pci} reset  (or reboot the host)").format(pci=pci, img=image)


def check_device(device, driver, rows, policy=None):
    """Verdict for one rdma_nics device under the host's driver. Pure; returns a dict."""
    pol = normalise_policy(policy)
    driver = driver or {}
    flavour = driver.get("flavour") or "absent"
    version = driver.get("version")
    out = {
        "device": device.get("name"), "pci_address": device.get("pci_address"), "model": device.get("model"),
        "psid": device.get("psid"), "role": device.get("role"), "fw": device.get("fw_ver"),
        "fw_pending": device.get("fw_pending"), "driver_flavour": flavour, "driver_version": version,
        "verdict": None, "row": None, "rule": None, "expected": None, "source": None, "reason": "",
        "severity": "ok", "remediation": None,
    }
    if device.get("role") in pol["ignore_roles"]:
        out.update(verdict="ignored", rule="role:%s" % device.get("role"),
                   reason="%s %s serves role %s (NVLink fabric manager), not a data NIC: excluded from the gate"
                   % (device.get("model"), device.get("name"), device.get("role")))
        return out
    row, how = match_row(rows, flavour, version)
    if row is None:
        out.update(verdict="unknown", rule="no_row", expected="a matrix row for %s %s" % (flavour, version),
                   reason="driver %s %s is not in the firmware matrix (add a row via nic_firmware_gate_extra_rows)"
                   % (flavour, version))
    else:
        out.update(row=row["id"], source=row.get("source"))
        rule = row["models"].get(device.get("model"))
        if rule is None:
            out.update(verdict="unknown", rule="model_not_in_row",
                       expected="a %s entry in row %s" % (device.get("model"), row["id"]),
                       reason="row %s (matched by %s) says nothing about %s" % (row["id"], how, device.get("model")))
        else:
            verdict, rname = judge_fw(rule, device.get("fw_ver"))
            out.update(verdict=verdict, rule=rname, expected=expected_text(rule))
            if verdict == "ok":
                out["reason"] = "fw %s satisfies %s rule of row %s" % (device.get("fw_ver"), rname, row["id"])
            elif verdict == "unsupported":
                out["reason"] = "%s under %s %s: %s" % (device.get("model"), flavour, version, rule["unsupported"])
            else:
                out["reason"] = "fw %s does not satisfy row %s (%s): expected %s" % (
                    device.get("fw_ver"), row["id"], rname, out["expected"])
            pending = device.get("fw_pending")
            if pending and pending != device.get("fw_ver") and verdict != "unsupported":
                pv, prule = judge_fw(rule, pending)
                out.update(verdict="pending_reset", rule="fw_pending (flashed image %s: %s)" % (prule, pv),
                           reason="flashed image %s is not running yet (running %s; running fw is %s); flashed image is %s"
                           % (pending, device.get("fw_ver"), verdict, pv), pending_image_verdict=pv)
    v = out["verdict"]
    if v == "ok" or v == "ignored":
        out["severity"] = "ok"
    elif v in ("unknown", "pending_reset"):
        out["severity"] = pol[v]
    else:
        out["severity"] = "fail"
    if out["severity"] != "ok":
        if v == "pending_reset":
            pci = device.get("pci_address") or device.get("name")
            out["remediation"] = "activate the flashed image by hand: mlxfwreset -d %s reset (or reboot the host)" % pci
        elif v == "unknown":
            out["remediation"] = ("add a row for this driver to nic_firmware_gate_extra_rows (inventory), "
                                  "or set nic_firmware_gate_unknown_policy: warn")
        else:
            target = out["expected"] if v == "mismatch" else "a DOCA-OFED >= 25.01 driver and its bundled firmware"
            out["remediation"] = remediation(device, target if v == "mismatch" else None)
            if v == "unsupported":
                out["remediation"] = "install DOCA-OFED >= 25.01 (DOCA 2.10+) and its bundled firmware; " + out["remediation"]
    return out


def check_host(rdma_nics, rows, policy=None):
    """Verdicts for every device of one host's rdma_nics facts plus a summary."""
    rdma_nics = rdma_nics or {}
    driver = rdma_nics.get("driver") or {}
    devices = sorted(rdma_nics.get("devices") or [], key=lambda d: d.get("name") or "")
    verdicts = [check_device(d, driver, rows, policy) for d in devices]
    failing = [v for v in verdicts if v["severity"] == "fail"]
    warning = [v for v in verdicts if v["severity"] == "warn"]
    counts = {}
    for v in verdicts:
        counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
    status = "fail" if failing else ("warn" if warning else "ok")
    if not verdicts:
        status = "fail"
    # flashed images pending a reset that rdma_nics could not attribute to a device (e.g. 8 NICs of one PSID listed
    # by /dev/mst name without mst status): a host-level pending_reset finding under the pending_reset policy
    pol = normalise_policy(policy)
    host_findings = []
    for u in rdma_nics.get("fw_pending_unattributed") or []:
        host_findings.append({
            "verdict": "pending_reset", "severity": pol["pending_reset"], "device": u.get("device"),
            "psid": u.get("psid"), "fw_running": u.get("fw_running"), "fw_pending": u.get("fw_pending"),
            "reason": "flashed image %s (running %s) on %s, PSID %s, waits for a reset and matches no RDMA device"
                      % (u.get("fw_pending"), u.get("fw_running"), u.get("device"), u.get("psid")),
            "remediation": "find the device (mst status -v), then mlxfwreset -d %s reset (or reboot the host)"
                           % (u.get("device") or "<device>")})
    # mlxfwmanager ran but its output was not understood: whether a flashed image waits for a reset (the CX8 trap)
    # is unknown, which the unknown policy judges; it was only in the facts, where nobody read it
    if rdma_nics.get("mlxfwmanager_error"):
        host_findings.append({
            "verdict": "unknown", "severity": pol["unknown"], "device": None, "psid": None,
            "fw_running": None, "fw_pending": None, "reason": rdma_nics["mlxfwmanager_error"],
            "remediation": "run mlxfwmanager --query on the host and read it; if it lists the NICs, attach it to "
                           "an issue for the parser; or set nic_firmware_gate_unknown_policy: warn"})
    if any(f["severity"] == "fail" for f in host_findings):
        status = "fail"
    elif host_findings and status == "ok":
        status = "warn"
    return {"status": status, "driver": driver, "verdicts": verdicts, "counts": counts,
            "failing": [v["device"] for v in failing], "warnings": [v["device"] for v in warning],
            "no_devices": not verdicts, "host_findings": host_findings}


def device_message(host, v):
    """One line naming everything an on-call engineer needs."""
    return ("{host}: {dev} ({pci}) {model} fw {fw}{pend} under driver {fl} {ver}: {verdict} "
            "[row {row}, rule {rule}] expected {exp}. Fix: {rem}").format(
        host=host, dev=v["device"], pci=v["pci_address"], model=v["model"], fw=v["fw"],
        pend=(" (flashed, not running: %s)" % v["fw_pending"]) if v.get("fw_pending") else "",
        fl=v["driver_flavour"], ver=v["driver_version"], verdict=v["verdict"].upper(), row=v["row"] or "-",
        rule=v["rule"], exp=v["expected"] or "-", rem=v["remediation"] or "-")


def host_messages(host, result):
    msgs = [device_message(host, v) for v in result["verdicts"] if v["severity"] != "ok"]
    msgs += ["%s: host: %s: %s. Fix: %s" % (host, f["verdict"].upper(), f["reason"], f["remediation"])
             for f in result.get("host_findings") or []]
    if result.get("no_devices"):
        msgs.append("%s: no RDMA devices found (driver %s %s): cannot verify NIC firmware"
                    % (host, (result.get("driver") or {}).get("flavour"), (result.get("driver") or {}).get("version")))
    return msgs


# --------------------------------------------------------------------------- fleet audit (NICs + GPUs)

def gpu_fleet(gpu_by_host):
    """GPU driver / VBIOS consistency and NVLink links down across hosts.

    gpu_by_host: {host: gpu_topology facts}. Returns {'driver_versions': {ver: [hosts]}, 'vbios': {model: {ver: [host:idx]}},
    'nvlink_down': {host: [texts]}, 'hosts': {host: {...}}, 'problems': [...]}
    """
    drivers, vbios, nvl, per_host, problems = {}, {}, {}, {}, []
    for host in sorted(gpu_by_host):
        topo = gpu_by_host[host] or {}
        drv = topo.get("driver_version")
        drivers.setdefault(drv, []).append(host)
        down, hv = [], {}
        for g in topo.get("gpus") or []:
            name = g.get("name") or "unknown"
            vbios.setdefault(name, {}).setdefault(g.get("vbios_version"), []).append("%s:%s" % (host, g.get("index")))
            hv.setdefault(name, set()).add(g.get("vbios_version"))
            link = g.get("nvlink") or {}
            if link.get("links_down"):
                down.append("GPU %s: %s NVLink links down %s" % (g.get("index"), link["links_down"], link.get("down_links") or []))
        nvl[host] = down
        per_host[host] = {"driver_version": drv, "gpu_count": topo.get("gpu_count"),
                          "vbios": {k: sorted(str(x) for x in s) for k, s in hv.items()},
                          "nvlink_links_down": sum(((g.get("nvlink") or {}).get("links_down") or 0)
                                                   for g in topo.get("gpus") or [])}
    if len(drivers) > 1:
        problems.append("GPU driver differs across hosts: " + "; ".join(
            "%s on %s" % (k, ",".join(v)) for k, v in sorted(drivers.items(), key=lambda kv: str(kv[0]))))
    for model, vers in sorted(vbios.items()):
        if len(vers) > 1:
            problems.append("VBIOS differs for %s: " % model + "; ".join(
                "%s on %s" % (k, ",".join(v)) for k, v in sorted(vers.items(), key=lambda kv: str(kv[0]))))
    for host, down in sorted(nvl.items()):
        if down:
            problems.append("%s: %s" % (host, "; ".join(down)))
    return {"driver_versions": {str(k): v for k, v in drivers.items()},
            "vbios": {m: {str(k): v for k, v in d.items()} for m, d in vbios.items()},
            "nvlink_down": nvl, "hosts": per_host, "problems": problems}


def host_entry(value):
    """Normalise one fleet-mode entry.

    Accepts the normalised form {'status', 'msg', 'rdma_nics', 'gpu_topology'} or a task result registered by the
    audit's facts task (unreachable / failed / ok with ansible_facts or gathered, and gather_errors)."""
    value = value or {}
    if "status" in value and ("rdma_nics" in value or value["status"] != "ok"):
        return value
    msg = str(value.get("msg") or "").strip()
    if value.get("unreachable"):
        return {"status": "unreachable", "msg": msg or "host unreachable"}
    if value.get("failed") or value.get("skipped"):
        return {"status": "failed", "msg": msg or ("facts task skipped" if value.get("skipped") else "facts task failed")}
    facts = value.get("ansible_facts") or value.get("gathered") or {}
    errors = value.get("gather_errors") or {}
    entry = {"status": "ok", "msg": "; ".join("%s: %s" % kv for kv in sorted(errors.items())),
             "rdma_nics": facts.get("rdma_nics"), "gpu_topology": facts.get("gpu_topology"),
             "host_stack": value.get("host_stack")}
    if entry["rdma_nics"] is None:
        entry["status"] = "failed"
        entry["msg"] = entry["msg"] or "no rdma_nics facts returned"
    return entry


def audit_fleet(hosts, rows, policy=None):
    """hosts: {host: {'status': ok|unreachable|failed, 'msg': str, 'rdma_nics': {...}, 'gpu_topology': {...}}}."""
    report = {"hosts": {}, "nic_rows": [], "gpu": None, "summary": {}}
    gpu_by_host = {}
    gpu_missing = []
    for host in sorted(hosts):
        h = host_entry(hosts[host])
        state = h.get("status") or "ok"
        entry = {"status": state, "msg": h.get("msg") or ""}
        if state == "ok" and h.get("rdma_nics") is not None:
            res = check_host(h["rdma_nics"], rows, policy)
            entry.update(status=res["status"], nic=res, messages=host_messages(host, res))
            for v in res["verdicts"]:
                r = dict(v)
                r["host"] = host
                report["nic_rows"].append(r)
        elif state == "ok":
            entry.update(status="failed", msg=entry["msg"] or "no rdma_nics facts")
        stack = h.get("host_stack")
        if state == "ok" and stack:
            # the host stack's proof (roles/host_stack, read-only): each failing check is a finding of this host
            failures = list(stack.get("failures") or [])
            entry["host_stack"] = {"summary": stack.get("summary") or [], "failures": failures}
            entry["messages"] = entry.get("messages", []) + failures
        if state == "ok":
            if h.get("gpu_topology") is not None:
                gpu_by_host[host] = h["gpu_topology"]
            else:
                gpu_missing.append(host)
        report["hosts"][host] = entry
    report["gpu"] = gpu_fleet(gpu_by_host)
    for host in gpu_missing:
        report["gpu"]["problems"].append("%s: no gpu_topology facts (%s)" % (host, report["hosts"][host]["msg"] or "not gathered"))
    statuses = [e["status"] for e in report["hosts"].values()]
    verdicts = {}
    for r in report["nic_rows"]:
        verdicts[r["verdict"]] = verdicts.get(r["verdict"], 0) + 1
    unreachable = sorted(h for h, e in report["hosts"].items() if e["status"] in ("unreachable", "failed"))
    failing = sorted(h for h, e in report["hosts"].items()
                     if e["status"] == "fail" or (e.get("host_stack") or {}).get("failures"))
    report["summary"] = {
        "hosts": len(statuses), "unreachable_or_failed": unreachable, "failing": failing,
        "warning": sorted(h for h, e in report["hosts"].items() if e["status"] == "warn"),
        "verdicts": verdicts, "gpu_problems": len(report["gpu"]["problems"]),
        "exit_code": exit_code(unreachable, failing, report["gpu"]["problems"]),
    }
    return report


def exit_code(unreachable, failing, gpu_problems):
    """3 when any host could not be audited (wins: the audit is incomplete), 2 on any finding, else 0."""
    if unreachable:
        return 3
    if failing or gpu_problems:
        return 2
    return 0
