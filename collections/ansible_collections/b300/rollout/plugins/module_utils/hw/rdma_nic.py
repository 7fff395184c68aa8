# -*- coding: utf-8 -*-
"""Read RDMA NIC facts (ConnectX / BlueField) from sysfs and vendor tools into ``rdma_nics``.

Schema: docs/CONTRACTS.md. Plain stdlib functions, no Ansible imports.

Sources:
  * ``<sysfs_root>/class/infiniband/<dev>/`` (fw_ver, board_id, node_type, ports/<n>/{state,rate,link_layer},
    device -> the PCI device with vendor/device/numa_node/net/)
  * ``<sysfs_root>/module/mlx5_core/version`` (present only for OFED/DOCA-built drivers, not inbox)
  * ``ofed_info -s`` (:func:`parse_ofed_info`), ``mlxfwmanager --query`` (:func:`parse_mlxfwmanager`),
    ``ibstat`` (:func:`parse_ibstat`, optional)

:func:`build_rdma_nics` combines them and marks devices unusable with reasons.
"""
from __future__ import annotations

import os
import re

MELLANOX_VENDOR = "15b3"
PCI_MODELS = {
    "1021": "ConnectX-7",
    "1023": "ConnectX-8",
    "1025": "ConnectX-9",
    "a2dc": "BlueField-3",
}
CA_TYPE_MODELS = {"MT4129": "ConnectX-7", "MT4131": "ConnectX-8", "MT4133": "ConnectX-9", "MT41692": "BlueField-3"}
DATA_NIC_MODELS = ("ConnectX-8", "ConnectX-9")

# 25.10-1.2.2, 24.10-1.1.4.0.200 (kept whole), MLNX_OFED 5.8-1.1.2.1 / 4.9-6.0.6.0 (one-digit minor)
LEGACY_RE = re.compile(r"(?<![\d.])(\d{1,2})\.(\d{1,2})-(\d+(?:\.\d+){1,6})(?![\d.])")
# the in-kernel (inbox) mlx5_core's MODULE_VERSION, e.g. modinfo "version: 5.0-0" (removed from newer kernels)
INBOX_MODULE_RE = re.compile(r"^\d+\.\d+-\d+$")
# What `ethtool -i` (and a driver without MODULE_VERSION) reports for the in-kernel mlx5_core since kernel 5.x is the
# kernel release: three numeric parts (a one-digit major) then a free tail (6.8.0-41-generic, 6.16.3,
# 6.1.106-116.188.amzn2023.x86_64, 6.4.0-rc2-...-dbg+). OFED versions have two parts before the dash (5.8-1.1.2.1,
# 24.10-1.1.4) and DOCA's yymm ones a four-digit first part (2410.1.1), so neither matches.
KERNEL_RELEASE_RE = re.compile(r"^[1-9]\.\d+\.\d+(?:[-+.~_][\w.+~-]*|\+)?$")
YYMM_RE = re.compile(r"(?<![\d.])(\d{2})(\d{2})\.(\d+)\.(\d+)(?:\.(\d+))?(?![\d])")


# --------------------------------------------------------------------------- small readers
def _read(path):
    try:
        with open(path) as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _read_bytes(path, limit=65536):
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return b""


# The NVSwitch management bridge of an HGX B200/B300 (an onboard ConnectX-7) says SW_MNG in its PCI VPD: NVIDIA's
# driver container detects NVLink 5 by this string in /sys/class/infiniband/*/device/vpd (NVIDIA/gpu-driver-container
# ubuntu24.04/nvidia-driver:169-191; ../shared/reference/host-stack-facts.md). flint cannot read that device
# (Mellanox/nic-configuration-operator #496) and nothing should burn it: it is never a data NIC.
SW_MNG_MARK = b"SW_MNG"


def vpd_is_sw_mng(pci_device_dir):
    """True when the PCI device's VPD (binary, read as bytes) carries ``SW_MNG``."""
    return SW_MNG_MARK in _read_bytes(os.path.join(pci_device_dir, "vpd"))


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def normalize_pci(value):
    """``0000:1A:00.0`` / ``1a:00.0`` -> ``0000:1a:00.0``; None when not a PCI address."""
    if not value:
        return None
    v = value.strip().lower()
    m = re.match(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", v)
    if not m:
        return None
    return "%04x:%02x:%02x.%s" % (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), m.group(4))


# --------------------------------------------------------------------------- versions
def parse_driver_version(text):
    """Parse an OFED/DOCA driver version string.

    ``25.10-1.2.2`` / ``24.10-3.2.5.0`` -> scheme ``legacy``; ``2607.0.100`` (YYMM.x.y, DOCA-OFED >= 26.07) ->
    scheme ``yymm``. Returns {version, scheme, year, month, key} (``key`` is a tuple that orders releases
    across both schemes: (yy, mm, rest...)) or None when nothing matches.
    """
    if not text:
        return None
    m = LEGACY_RE.search(text)
    if m:
        nums = [int(m.group(1)), int(m.group(2))] + [int(x) for x in m.group(3).split(".")]
        ver = "%s.%s-%s" % (m.group(1), m.group(2), m.group(3))
        return {"version": ver, "scheme": "legacy", "year": nums[0], "month": nums[1], "key": tuple(nums)}
    m = YYMM_RE.search(text)
    if m and 1 <= int(m.group(2)) <= 12:
        nums = [int(x) for x in m.groups() if x is not None]
        ver = "%s%s.%s" % (m.group(1), m.group(2), ".".join(x for x in m.groups()[2:] if x is not None))
        return {"version": ver, "scheme": "yymm", "year": nums[0], "month": nums[1], "key": tuple(nums)}
    return None


def parse_ofed_info(text):
    """Parse ``ofed_info -s``: ``MLNX_OFED_LINUX-24.10-3.2.5.0:`` or ``OFED-internal-25.10-1.7.1:``.

    Returns {raw, flavour (mlnx_ofed|doca_ofed|None), version} or None for empty output.
    """
    if not text or not text.strip():
        return None
    raw = text.strip().splitlines()[0].strip().rstrip(":").strip()
    flavour = None
    if raw.startswith("MLNX_OFED_LINUX-"):
        flavour = "mlnx_ofed"
    elif raw.startswith("OFED-internal-") or raw.upper().startswith("DOCA"):
        flavour = "doca_ofed"
    parsed = parse_driver_version(raw)
    return {"raw": raw, "flavour": flavour, "version": parsed["version"] if parsed else None}


def parse_modinfo_version(text):
    """The ``version:`` line of ``modinfo mlx5_core`` (or a bare version string); None when absent."""
    for ln in (text or "").splitlines():
        m = re.match(r"^\s*version:\s*(\S+)", ln)
        if m:
            return m.group(1)
    t = (text or "").strip()
    return t if t and "\n" not in t and ":" not in t.rstrip(":") else None


def classify_driver_version(text, kernel_release=None):
    """Flavour and version from what a host prints about its mlx5 driver.

    Accepts ``ofed_info -s`` output (``MLNX_OFED_LINUX-5.8-1.1.2.1:``, ``OFED-internal-24.10-1.1.4.0.200:``), ``modinfo
    mlx5_core`` output or its ``version:`` value, or a bare version. Returns {flavour, version, version_scheme, raw}:
    ``mlnx_ofed`` for MLNX_OFED_LINUX-* and any legacy version of year < 25 (4.x, 5.x, 23.x, 24.x without a DOCA
    marker), ``doca_ofed`` for OFED-internal-* / DOCA and 25.x+ / YYMM versions, ``inbox`` for the in-kernel
    MODULE_VERSION (``5.0-0``: its version is the kernel release when known) and for ``ethtool -i`` output whose
    version is a kernel release (``6.8.0-41-generic``), ``unknown`` otherwise (never dropped: the raw text is kept).
    """
    if not text or not str(text).strip():
        return {"flavour": "unknown", "version": None, "version_scheme": None, "raw": None}
    raw_text = str(text)
    ofed = None
    for ln in raw_text.splitlines():
        ls = ln.strip()
        if ls.startswith(("MLNX_OFED_LINUX-", "OFED-internal-", "OFED-", "DOCA")) or ls.upper().startswith("DOCA"):
            ofed = parse_ofed_info(ls)
            break
    if ofed:
        parsed = parse_driver_version(ofed["raw"])
        flavour = ofed["flavour"]
        if flavour is None and parsed:
            flavour = "doca_ofed" if parsed["scheme"] == "yymm" or parsed["year"] >= 25 else "mlnx_ofed"
        return {"flavour": flavour or "unknown", "version": parsed["version"] if parsed else None,
                "version_scheme": parsed["scheme"] if parsed else None, "raw": ofed["raw"]}
    value = parse_modinfo_version(raw_text)
    if value and INBOX_MODULE_RE.match(value):
        return {"flavour": "inbox", "version": kernel_release or value,
                "version_scheme": "kernel" if kernel_release else "module", "raw": value}
    if value and (value == kernel_release or KERNEL_RELEASE_RE.match(value)):
        # `ethtool -i` of the in-kernel driver: its version IS the kernel release
        return {"flavour": "inbox", "version": value, "version_scheme": "kernel", "raw": value}
    parsed = parse_driver_version(value) if value else None
    if parsed:
        flavour = "doca_ofed" if parsed["scheme"] == "yymm" or parsed["year"] >= 25 else "mlnx_ofed"
        return {"flavour": flavour, "version": parsed["version"], "version_scheme": parsed["scheme"], "raw": value}
    return {"flavour": "unknown", "version": value, "version_scheme": None, "raw": value}


def driver_facts(sysfs_root, ofed_info_text=None, kernel_release=None):
    """The ``driver`` part of ``rdma_nics``.

    flavour: ``absent`` (no mlx5_core module in sysfs), ``inbox`` (module without a version file),
    ``doca_ofed`` (ofed_info says OFED-internal-..., or version 25.x+ / yymm scheme), ``mlnx_ofed``
    (ofed_info says MLNX_OFED_LINUX-..., or version 24.x and older).
    """
    root = sysfs_root or "/sys"
    ofed = parse_ofed_info(ofed_info_text)
    mod_dir = os.path.join(root, "module", "mlx5_core")
    module_version = _read(os.path.join(mod_dir, "version"))
    if module_version is None:
        module_version = _read(os.path.join(root, "bus", "pci", "drivers", "mlx5_core", "module", "version"))
    has_module = os.path.isdir(mod_dir) or os.path.isdir(os.path.join(root, "bus", "pci", "drivers", "mlx5_core"))
    out = {"flavour": "absent", "version": None, "version_scheme": None,
           "ofed_info": ofed["raw"] if ofed else None}
    if module_version is None or INBOX_MODULE_RE.match(module_version.strip()):
        # no version file, or the in-kernel MODULE_VERSION ("5.0-0"): the inbox driver, unless ofed_info says otherwise
        if ofed and ofed["flavour"] and ofed["version"] and module_version is not None:
            parsed = parse_driver_version(ofed["raw"])
            out.update(flavour=ofed["flavour"], version=parsed["version"], version_scheme=parsed["scheme"])
        elif has_module or module_version is not None:
            out.update(flavour="inbox", version=kernel_release or module_version,
                       version_scheme="kernel" if kernel_release else ("module" if module_version else None))
        return out
    parsed = parse_driver_version(module_version)
    if parsed is None and ofed and ofed["version"]:
        parsed = parse_driver_version(ofed["version"])
    if parsed is None:
        out.update(flavour="unknown", version=module_version, version_scheme=None)
        return out
    if ofed and ofed["flavour"]:
        flavour = ofed["flavour"]
    elif parsed["scheme"] == "yymm" or parsed["year"] >= 25:
        flavour = "doca_ofed"
    else:
        flavour = "mlnx_ofed"
    out.update(flavour=flavour, version=parsed["version"], version_scheme=parsed["scheme"])
    return out


# --------------------------------------------------------------------------- mlxfwmanager / ibstat
_KV_RE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9 ./]*?):\s*(.*?)\s*$")
# version rows: "FW             28.42.1000     28.43.1014", "FW (Running)   24.35.2000     N/A",
# "UEFI Virtio blk   22.4.0010      N/A" (names with single spaces)
_VER_ROW_RE = re.compile(r"^\s+([A-Za-z0-9_]+(?: [A-Za-z0-9_()]+)*)\s{2,}(\S+)(?:\s+(\S+))?\s*$")
# /dev/mst/mt4129_pciconf0, mt4129_pciconf0.1 (a further PCI function), mt4103_pci_cr0 (Windows: no /dev/mst/)
MST_RE = re.compile(r"^(?:/dev/mst/)?(mt\d+_pci\w*?\d+(?:\.\d+)?)$")
# a device block starts with "Device #3:" alone on its line; "Device #3: Updating FW ..." is the update section
_BLOCK_RE = re.compile(r"^\s*Device\s+#(\d+)\s*:\s*$")
_PROGRESS_RE = re.compile(r"^\s*Device\s+#(\d+)\s*:\s*(\S.*?)\s*$")


def _na(v):
    return None if v is None or v.strip().upper() in ("", "N/A", "NA", "-", "--") else v.strip()


def _new_fw_record():
    return {"device_type": None, "part_number": None, "description": None, "psid": None,
            "pci_device_name": None, "pci_address": None, "mst_device": None, "base_guid": None,
            "base_mac": None, "fw_current": None, "fw_available": None, "fw_running": None, "status": None,
            "update_result": None, "fw_flashed": None}


def _set_device_name(rec, val):
    rec["pci_device_name"] = _na(val)
    rec["pci_address"] = normalize_pci(val)
    if rec["pci_address"] is None and val and MST_RE.match(val.strip()):
        # MST service running: /dev/mst/mt4129_pciconf0 (Linux) or mt4103_pci_cr0 (Windows), not a PCI address
        rec["mst_device"] = val.strip()


def _parse_mlxfwmanager_xml(text):
    """``--query-format XML``: <Devices><Device pciName= type= psid= partNumber=><Versions><FW current= available=/>
    (a running image that differs shows as another Versions child whose tag starts with FW and names Running)..."""
    import xml.etree.ElementTree as ET
    body = text[text.index("<Devices"):]
    end = body.rfind("</Devices>")
    body = body[:end + len("</Devices>")] if end >= 0 else body
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise ValueError("mlxfwmanager XML output not parseable: %s" % exc) from exc
    devices = []
    for dev in root.iter("Device"):
        rec = _new_fw_record()
        a = dev.attrib
        rec.update(device_type=_na(a.get("type")), psid=_na(a.get("psid")), part_number=_na(a.get("partNumber")))
        _set_device_name(rec, a.get("pciName") or "")
        versions = dev.find("Versions")
        for v in (list(versions) if versions is not None else []):
            tag = v.tag.lower()
            if tag == "fw":
                rec["fw_current"], rec["fw_available"] = _na(v.get("current")), _na(v.get("available"))
            elif tag.startswith("fw") and "running" in tag:
                rec["fw_running"] = _na(v.get("current"))
        macs, guids = dev.find("MACs"), dev.find("GUIDs")
        if macs is not None:
            rec["base_mac"] = _na(macs.get("Base_Mac") or macs.get("port1"))
        if guids is not None:
            rec["base_guid"] = _na(guids.get("Base_Guid") or guids.get("port1"))
        for key, tag in (("status", "Status"), ("description", "Description")):
            el = dev.find(tag)
            rec[key] = _na(el.text) if el is not None and el.text else None
        devices.append(rec)
    return devices


def parse_mlxfwmanager(text):
    """Parse ``mlxfwmanager --query`` (also ``mlxup --query``, and ``--query-format XML``).

    Returns a list of {device_type, part_number, description, psid, pci_device_name, pci_address, mst_device,
    base_guid, base_mac, fw_current, fw_available, fw_running, status, update_result, fw_flashed}. With the MST service
    running the ``PCI Device Name`` is an MST device (``/dev/mst/mt4129_pciconf0``): ``mst_device`` is set and
    ``pci_address`` is None (:func:`parse_mst_status` maps it); Ethernet-mode NICs print no ``Base GUID``
    (``base_mac`` only); dual-port cards in per-port mode print ``Port1 MAC`` / ``Port1 GUID`` (taken as the base).
    ``fw_running`` comes from the ``FW (Running)`` row that appears while a newly flashed image waits for a reset; then
    ``fw_current`` (the ``FW`` row) is the flashed image.

    Update runs (``mlxfwmanager -u``, ``mlxup`` answering y, mlnx-fw-updater) print the same query blocks first
    (their ``Current`` is the image before the update), then ``Device #N: Updating FW ...`` ... ``Done``:
    ``update_result`` is ``updated`` / ``up to date`` / ``failed`` / ``incomplete`` (no Done seen) or what the line
    said, and ``fw_flashed`` the ``Available`` image burnt by an ``updated`` device (pending until a reset).
    Empty text gives []; text with no device block raises ValueError (never an empty list for output not understood).

    Long on purpose (issue 39 keeps at most three functions of 100 lines): one pass over the
    lines of one tool's output, its text and XML forms and the update-run blocks side by side, so that a reader
    checks each form against the captures in one place; split, the states would be passed between the pieces.
    """
    if not text or not text.strip():
        return []
    if "<Devices" in text and "<Device " in text:
        return _parse_mlxfwmanager_xml(text)
    devices = []
    by_num = {}
    cur = None
    in_versions = False
    upd = None  # the record whose update progress lines are being read
    for ln in text.splitlines():
        m = _BLOCK_RE.match(ln)
        if m:
            cur = _new_fw_record()
            devices.append(cur)
            by_num[int(m.group(1))] = cur
            in_versions = False
            upd = None
            continue
        m = _PROGRESS_RE.match(ln)
        if m:
            cur, in_versions = None, False
            upd = by_num.get(int(m.group(1)))
            if upd is not None:
                what = m.group(2).lower()
                if what.startswith("updating fw"):
                    upd["update_result"] = "incomplete"
                    if what.rstrip().endswith("done"):
                        upd["update_result"] = "updated"
                elif what.startswith("up to date"):
                    upd["update_result"], upd = "up to date", None
                else:
                    upd["update_result"] = "failed" if ("fail" in what or "-e-" in what) else what
            continue
        if re.match(r"^\s*Found \d+ device\(s\) requiring", ln):
            cur, in_versions = None, False  # end of the query part: what follows belongs to no device block
            continue
        if upd is not None and upd["update_result"] == "incomplete":
            ls = ln.strip()
            if ls.endswith("Done"):
                upd["update_result"] = "updated"
            elif "-E-" in ls or "fail" in ls.lower():
                upd["update_result"] = "failed"
            continue
        if cur is None:
            continue
        if in_versions:
            if not ln.strip():
                continue  # a blank line inside the table (mail and forum copies insert them): the rows go on
            m = _VER_ROW_RE.match(ln)
            if m and ":" not in m.group(1):
                name = m.group(1)
                if name == "FW":
                    cur["fw_current"], cur["fw_available"] = _na(m.group(2)), _na(m.group(3))
                elif name.startswith("FW (Running"):
                    cur["fw_running"] = _na(m.group(2))
                continue
            in_versions = False
        m = _KV_RE.match(ln)
        if not m:
            continue
        key, val = m.group(1).strip().lower(), m.group(2)
        if key == "versions":
            in_versions = True
        elif key == "device type":
            cur["device_type"] = _na(val)
        elif key == "part number":
            cur["part_number"] = _na(val)
        elif key == "description":
            cur["description"] = _na(val)
        elif key == "psid":
            cur["psid"] = _na(val)
        elif key == "pci device name":
            _set_device_name(cur, val)
        elif key == "base guid" or (key in ("port1 guid", "port guid") and cur["base_guid"] is None):
            cur["base_guid"] = _na(val)
        elif key == "base mac" or (key == "port1 mac" and cur["base_mac"] is None):
            cur["base_mac"] = _na(val)
        elif key == "status":
            cur["status"] = _na(val)
    for rec in devices:
        if rec["update_result"] == "updated":
            rec["fw_flashed"] = rec["fw_available"]
    if not devices:
        err = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("-E-")]
        raise ValueError("mlxfwmanager output has no device block (%s)" % (
            err[0] if err else "first line: %r" % text.strip().splitlines()[0][:120]))
    return devices


def pending_image(rec):
    """The flashed firmware image of one :func:`parse_mlxfwmanager` record that waits for a reset, or None.

    ``FW (Running)`` differing from ``FW``: the ``FW`` image. An update run that burnt an image (``update_result``
    ``updated``): ``fw_flashed`` unless it equals the image it replaced, ``unknown`` when no Available version was
    printed. An update that did not finish (``incomplete``/``failed``) leaves the flash state ``unknown``.
    """
    if rec.get("fw_running") and rec.get("fw_current") and rec["fw_running"] != rec["fw_current"]:
        return rec["fw_current"]
    result = rec.get("update_result")
    if result == "updated":
        flashed = rec.get("fw_flashed")
        if flashed is None:
            return "unknown"
        return flashed if flashed != (rec.get("fw_running") or rec.get("fw_current")) else None
    if result in ("incomplete", "failed"):
        return "unknown"
    return None


def parse_mst_status(text):
    """MST device -> PCI address from ``mst status -v`` (table rows ``ConnectX7(rev:0) /dev/mst/mt4129_pciconf0
    b1:00.0 mlx5_0 ...``) or plain ``mst status`` (``/dev/mst/mt4129_pciconf0 - PCI configuration cycles access.`` and
    a following ``domain:bus:dev.fn=0000:05:00.0`` line). Keys are the full /dev/mst path and the bare name. Extra
    columns (VFIO), blank lines between rows and further PCI functions (``mt4129_pciconf0.1``) are fine; a
    ``pciconfK`` row without an address takes its ``pci_crK`` sibling's (and the other way round)."""
    out = {}
    seen = []
    last = None
    for ln in (text or "").splitlines():
        toks = ln.split()
        mst = next((t for t in toks if t.startswith("/dev/mst/")), None)
        if mst:
            last = mst
            seen.append(mst)
            pci = next((normalize_pci(t) for t in toks if normalize_pci(t)), None)
            if pci:
                out[mst] = pci
                out[mst.rsplit("/", 1)[-1]] = pci
                last = None
            continue
        m = re.search(r"domain:bus:dev\.fn=(\S+)", ln)
        if m and last and normalize_pci(m.group(1)):
            out[last] = normalize_pci(m.group(1))
            out[last.rsplit("/", 1)[-1]] = out[last]
            last = None
    # ConnectX-3 era tables print mtNNNN_pciconfK with an empty PCI column and the same device again as
    # mtNNNN_pci_crK with its address (newer tables print both with the address): a name without an address takes
    # its pciconf<->pci_cr sibling's, never a guess from row order
    for name in seen:
        if name in out:
            continue
        sm = re.match(r"^(.*/mt\d+_)(pciconf|pci_cr)(\d+(?:\.\d+)?)$", name)
        if sm:
            sib = sm.group(1) + ("pci_cr" if sm.group(2) == "pciconf" else "pciconf") + sm.group(3)
            if sib in out:
                out[name] = out[sib]
                out[name.rsplit("/", 1)[-1]] = out[sib]
    return out


def _mac_of_guid(guid):
    """RoCE/IB node GUID e09d:7303:0012:6474 -> base MAC e09d73126474 (the GUID is the MAC with 0300 in the middle)."""
    g = (guid or "").replace(":", "").lower()
    return g[:6] + g[10:] if len(g) == 16 else None


def parse_ibstat(text):
    """Parse ``ibstat``: {ca_name: {ca_type, fw_ver, ports: {n: {state, rate, link_layer}}}}."""
    out = {}
    ca = port = None
    for ln in (text or "").splitlines():
        m = re.match(r"^CA '([^']+)'", ln)
        if m:
            ca = out.setdefault(m.group(1), {"ca_type": None, "fw_ver": None, "ports": {}})
            port = None
            continue
        if ca is None:
            continue
        m = re.match(r"^\s*Port (\d+):\s*$", ln)
        if m:
            port = ca["ports"].setdefault(int(m.group(1)), {})
            continue
        m = _KV_RE.match(ln)
        if not m:
            continue
        key, val = m.group(1).strip().lower(), m.group(2)
        if port is None:
            if key == "ca type":
                ca["ca_type"] = val
            elif key == "firmware version":
                ca["fw_ver"] = val
        elif key in ("state", "rate", "link layer"):
            port[key.replace(" ", "_")] = val
    return out


# --------------------------------------------------------------------------- sysfs
def _port_facts(port_dir, port_name):
    state_raw = _read(os.path.join(port_dir, "state")) or ""
    m = re.match(r"^\s*(\d+)\s*:\s*(\S+)", state_raw)
    state, code = (m.group(2), int(m.group(1))) if m else ((state_raw or None), None)
    rate = _read(os.path.join(port_dir, "rate"))
    rate_gbps = None
    if rate:
        rm = re.match(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate)
        if rm:
            f = float(rm.group(1))
            rate_gbps = int(f) if f.is_integer() else f
    try:
        port_no = int(port_name)
    except ValueError:
        port_no = port_name
    return {"port": port_no, "state": state, "state_code": code, "rate_gbps": rate_gbps, "rate": rate,
            "link_layer": _read(os.path.join(port_dir, "link_layer"))}


def read_ib_devices(sysfs_root):
    """Raw per-device facts from ``<sysfs_root>/class/infiniband``; sorted by name."""
    base = os.path.join(sysfs_root or "/sys", "class", "infiniband")
    devices = []
    for name in _listdir(base):
        d = os.path.join(base, name)
        pci_dev = os.path.join(d, "device")
        pci_address = None
        if os.path.exists(pci_dev):
            pci_address = normalize_pci(os.path.basename(os.path.realpath(pci_dev)))
        dev_id = (_read(os.path.join(pci_dev, "device")) or "").lower().replace("0x", "") or None
        vendor = (_read(os.path.join(pci_dev, "vendor")) or "").lower().replace("0x", "") or None
        numa = _read(os.path.join(pci_dev, "numa_node"))
        try:
            numa = int(numa) if numa is not None else None
        except ValueError:
            numa = None
        if numa is not None and numa < 0:
            numa = None
        node_type_raw = _read(os.path.join(d, "node_type")) or ""
        nm = re.match(r"^\s*\d+\s*:\s*(\S+)", node_type_raw)
        node_type = nm.group(1) if nm else (node_type_raw or None)
        ports = [_port_facts(os.path.join(d, "ports", p), p)
                 for p in sorted(_listdir(os.path.join(d, "ports")), key=lambda x: (len(x), x))]
        model = PCI_MODELS.get(dev_id, "unknown") if vendor in (None, MELLANOX_VENDOR) else "unknown"
        if model == "unknown":
            model = CA_TYPE_MODELS.get("MT" + (_read(os.path.join(d, "hca_type")) or "").replace("MT", ""), "unknown")
        devices.append({
            "name": name,
            "pci_address": pci_address,
            "pci_device_id": dev_id,
            "model": model,
            "fw_ver": _read(os.path.join(d, "fw_ver")),
            "psid": _read(os.path.join(d, "board_id")),
            "node_guid": _read(os.path.join(d, "node_guid")),
            "node_type": node_type,
            "numa_node": numa,
            "netdevs": _listdir(os.path.join(pci_dev, "net")),
            "sw_mng": vpd_is_sw_mng(pci_dev),
            "ports": ports,
        })
    return devices


# --------------------------------------------------------------------------- build
def _match_fw(dev, fw_list, mst_map=None, taken=()):
    """The mlxfwmanager record for a sysfs device and how it was matched, or (None, None).

    Order: PCI address (also through ``mst status`` for /dev/mst names), node GUID, base MAC (the node GUID's MAC, or a
    netdev's MAC), then a PSID only when exactly one device record and one sysfs device carry it. ``taken``: records
    already attributed (a record never serves two devices).
    """
    mst_map = mst_map or {}
    cands = [r for r in fw_list if id(r) not in taken]
    for rec in cands:
        pci = rec["pci_address"] or mst_map.get(rec.get("mst_device") or "") \
            or mst_map.get((rec.get("mst_device") or "").rsplit("/", 1)[-1])
        if pci and pci == dev["pci_address"]:
            return rec, "pci" if rec["pci_address"] else "mst"
    guid = (dev.get("node_guid") or "").replace(":", "").lower()
    if guid and guid.strip("0"):
        for rec in cands:
            if (rec["base_guid"] or "").replace(":", "").lower() == guid:
                return rec, "guid"
    macs = set(m for m in [_mac_of_guid(guid)] + [(m or "").replace(":", "").lower() for m in dev.get("macs", [])] if m)
    if macs:
        for rec in cands:
            if (rec["base_mac"] or "").replace(":", "").lower() in macs:
                return rec, "mac"
    psid = dev.get("psid")
    same = [r for r in fw_list if r["psid"] and r["psid"] == psid]
    if len(same) == 1 and id(same[0]) not in taken and dev.get("psid_unique", True):
        return same[0], "psid"
    return None, None


def build_rdma_nics(sysfs_root="/sys", ofed_info_text=None, mlxfwmanager_text=None, kernel_release=None,
                    fabric_manager_devices=(), mst_status_text=None):
    """Build the ``rdma_nics`` fact.

    Role ``fabric_manager``: a ConnectX-7 on a host that also has ConnectX-8/9 NICs (the HGX B300 NVLink
    management NIC), or any device named in ``fabric_manager_devices``. Role ``frontend``: on such a host, any other
    model (a BlueField-3 north-south/storage DPU, an older ConnectX, an unknown device id): an *active* port there is
    not the GPU fabric, and NCCL or Mooncake auto-discovery would otherwise take it. Neither is ever usable (a CX8 of
    an unknown device id then shows up as a missing data NIC, never as a wrong one).
    A pending firmware image (``fw_pending``) does not make a device unusable: the firmware gate decides.
    """
    devices = read_ib_devices(sysfs_root)
    findings = []
    mlxfwmanager_error = None
    try:
        fw_list = parse_mlxfwmanager(mlxfwmanager_text) if mlxfwmanager_text else []
    except ValueError as exc:
        # output not understood: say so (pending images unknown), never read it as "no devices"
        fw_list = []
        mlxfwmanager_error = "mlxfwmanager: output not understood, flashed-but-not-running images unknown: %s" % exc
        findings.append(mlxfwmanager_error)
    mst_map = parse_mst_status(mst_status_text)
    psid_count = {}
    for d in devices:
        psid_count[d["psid"]] = psid_count.get(d["psid"], 0) + 1
    taken = set()
    fm_names = set(fabric_manager_devices or ())
    has_data_gen = any(d["model"] in DATA_NIC_MODELS for d in devices)
    out_devices = []
    for d in devices:
        role, reasons = _role(d, fm_names, has_data_gen)
        reasons += _port_reasons(d)
        active = [p for p in d["ports"] if p["state"] == "ACTIVE"]
        probe = dict(d, psid_unique=psid_count.get(d["psid"]) == 1,
                     macs=[_read(os.path.join(sysfs_root or "/sys", "class", "net", n, "address")) for n in d["netdevs"]])
        rec, how = _match_fw(probe, fw_list, mst_map, taken)
        fw_pending, fw_available, fw_status = _fw_state(d, rec)
        if rec:
            taken.add(id(rec))
        usable = not reasons and bool(active)
        dev = dict(d)
        dev.pop("node_guid", None)
        dev.update({"role": role, "usable": usable, "unusable_reasons": reasons,
                    "fw_pending": fw_pending, "fw_available": fw_available, "fw_status": fw_status,
                    "fw_record_match": how})
        out_devices.append(dev)
    # a flashed image waiting for a reset that no device could be matched with is a host-level finding, never dropped
    unattributed = _unattributed(fw_list, taken)
    findings += ["mlxfwmanager: flashed image %s (running %s) on %s (PSID %s) pending a reset, not attributable to an "
                 "RDMA device (run mst status -v or give the PCI address)"
                 % (u["fw_pending"], u["fw_running"], u["device"], u["psid"]) for u in unattributed]
    return {
        "driver": driver_facts(sysfs_root, ofed_info_text, kernel_release),
        "devices": out_devices,
        "usable_devices": sorted(d["name"] for d in out_devices if d["usable"] and d["role"] == "data"),
        "fw_pending_unattributed": unattributed,
        "mlxfwmanager_error": mlxfwmanager_error,
        "findings": findings,
    }


def _role(d, fm_names, has_data_gen):
    """A device's role (data, fabric_manager, frontend; see build_rdma_nics) and, for the last two, why."""
    reasons = []
    role = "data"
    if d["sw_mng"]:
        role = "fabric_manager"
        reasons.append("NVSwitch management bridge (%s %s, SW_MNG in its VPD): serves the fabric manager and "
                       "NVLSM, not a data NIC; left out of the firmware gate, the audit and the update (flint "
                       "cannot read it)" % (d["model"], d["pci_address"]))
    elif d["name"] in fm_names or (d["model"] == "ConnectX-7" and has_data_gen):
        role = "fabric_manager"
        reasons.append("fabric-manager NIC (%s %s): reserved for NVLink management, not for data" % (
            d["model"], d["pci_address"]))
    elif has_data_gen and d["model"] not in DATA_NIC_MODELS:
        role = "frontend"
        reasons.append("frontend NIC (%s %s, device id %s): not a ConnectX-8/9 GPU-fabric NIC on this host, kept "
                       "out of NCCL_IB_HCA and --disaggregation-ib-device" % (
                           d["model"], d["pci_address"], d.get("pci_device_id")))
    return role, reasons


def _port_reasons(d):
    """Why a device's node type or ports make it unusable (none: it may be used)."""
    reasons = []
    if d["node_type"] != "CA":
        reasons.append("node_type %s, expected CA" % d["node_type"])
    if not d["ports"]:
        reasons.append("no ports in sysfs")
    for p in d["ports"]:
        if p["state"] != "ACTIVE":
            reasons.append("port %s state %s, expected ACTIVE" % (p["port"], p["state"]))
        if (p["link_layer"] or "unknown").lower() not in ("infiniband", "ethernet"):
            reasons.append("port %s link_layer %s, expected InfiniBand or Ethernet" % (p["port"], p["link_layer"]))
    return reasons


def _fw_state(d, rec):
    """(fw_pending, fw_available, fw_status) of a device from its mlxfwmanager record rec (None: all None)."""
    fw_pending = fw_available = fw_status = None
    if rec:
        fw_available = rec["fw_available"]
        fw_status = rec["status"]
        fw_pending = pending_image(rec)
        if fw_pending and rec["update_result"] and not rec["fw_running"] and fw_pending == d["fw_ver"]:
            fw_pending = None  # an update-run log older than the reset: the device already runs that image
        elif fw_pending is None and rec["fw_current"] and d["fw_ver"] and rec["fw_current"] != d["fw_ver"] \
                and rec["update_result"] != "updated":
            # no "FW (Running)" row, but the flashed image differs from what the running driver reports
            fw_pending = rec["fw_current"]
    return fw_pending, fw_available, fw_status


def _unattributed(fw_list, taken):
    """The mlxfwmanager records with a flashed image pending a reset that no device was matched with."""
    unattributed = []
    for rec in fw_list:
        if id(rec) in taken:
            continue
        pend = pending_image(rec)
        if pend:
            unattributed.append({"device": rec["mst_device"] or rec["pci_device_name"],
                                 "pci_address": rec["pci_address"], "psid": rec["psid"], "base_guid": rec["base_guid"],
                                 "base_mac": rec["base_mac"], "fw_running": rec["fw_running"] or rec["fw_current"],
                                 "fw_pending": pend})
    return unattributed
