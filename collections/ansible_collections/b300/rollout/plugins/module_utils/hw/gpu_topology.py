# -*- coding: utf-8 -*-
"""Parse nvidia-smi outputs into the ``gpu_topology`` fact (schema: docs/CONTRACTS.md).

Plain stdlib functions, no Ansible imports, so they run on any target host and in pytest.

Inputs (each tool is run once by plugins/modules/gpu_topology_facts.py):
  * ``nvidia-smi -q -x``   -> :func:`parse_smi_xml`
  * ``nvidia-smi topo -m`` -> :func:`parse_topo`
  * ``nvidia-smi nvlink -s`` -> :func:`parse_nvlink_status`
  * optional text banner (plain ``nvidia-smi`` / ``nvidia-smi -q``) -> :func:`parse_banner`
    (only needed when the XML carries no driver version, e.g. an R610+ driver whose XML
    element names we do not know yet).

:func:`build_gpu_topology` combines them (plus a sysfs fallback for NUMA nodes) and
:func:`health_problems` turns the result into problem records used for ``problems`` and
by the gpu_health_gate role.
"""
from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET

ANSI_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
NA_VALUES = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "none", "not available"}

# clock event reasons that mean the GPU's clocks are being held down (gpu_idle, sync_boost,
# applications/display clock settings are not); the gate and the fact's `throttled` count only
# DEFAULT_GATE_THROTTLE_REASONS (sw_power_cap is normal on a loaded GPU)
THROTTLE_REASONS = (
    "sw_power_cap",
    "hw_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "sw_thermal_slowdown",
)

# element names that may carry the versions; R610+ drivers renamed the banner labels to
# "KMD Version" / "CUDA UMD Version" (the XML names below the first are accepted defensively)
DRIVER_VERSION_TAGS = ("driver_version", "kmd_version", "kmd_driver_version", "kernel_mode_driver_version")
CUDA_VERSION_TAGS = ("cuda_version", "cuda_umd_version", "umd_version", "cuda_user_mode_driver_version")

TOPO_LEVELS = ("PIX", "PXB", "PHB", "NODE", "SYS")


# --------------------------------------------------------------------------- helpers
def clean(value):
    """Strip a text value; map N/A-like strings to None."""
    if value is None:
        return None
    value = value.strip()
    if value.lower() in NA_VALUES:
        return None
    return value


def _text(elem, path):
    if elem is None:
        return None
    found = elem.find(path)
    if found is None:
        return None
    return clean(found.text)


def to_int(value):
    """First integer in a value like ``32 C`` / ``0 us`` / ``-2 C``; None when absent."""
    if value is None:
        return None
    m = re.search(r"-?\d+", str(value))
    return int(m.group(0)) if m else None


def to_float(value):
    if value is None:
        return None
    m = re.search(r"-?\d+(?:\.\d+)?", str(value))
    return float(m.group(0)) if m else None


def _yes_no(value):
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "true", "active", "enabled"):
        return True
    if v in ("no", "false", "not active", "disabled"):
        return False
    return None


def normalize_pci_bus_id(value):
    """``00000000:18:00.0`` -> ``0000:18:00.0`` (lower case, 4-digit domain); ``18:00.0`` -> ``0000:18:00.0``."""
    if value is None:
        return None
    v = value.strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", v)
    if not m:
        return v or None
    domain = int(m.group(1) or "0", 16)
    return "%04x:%02x:%02x.%s" % (domain, int(m.group(2), 16), int(m.group(3), 16), m.group(4))


# --------------------------------------------------------------------------- banner
def parse_banner(text):
    """Driver/CUDA versions from a text banner: ``Driver Version: x`` or R610+ ``KMD Version: x``,
    ``CUDA Version: y`` or ``CUDA UMD Version: y`` (works on plain ``nvidia-smi`` and ``nvidia-smi -q``)."""
    out = {"driver_version": None, "cuda_version": None}
    if not text:
        return out
    text = ANSI_RE.sub("", text)
    m = re.search(r"(?:KMD|Driver) Version\s*:\s*([0-9][0-9.]*)", text)
    if m:
        out["driver_version"] = m.group(1)
    m = re.search(r"CUDA (?:UMD )?Version\s*:\s*([0-9][0-9.]*)", text)
    if m:
        out["cuda_version"] = m.group(1)
    return out


# --------------------------------------------------------------------------- nvidia-smi -q -x
def _first_tag(root, tags):
    for tag in tags:
        v = _text(root, tag)
        if v:
            return v
    return None


def _clock_reasons(gpu):
    """Active clock event reasons, accepting the new and the old (<clocks_throttle_reasons>) element names."""
    active = []
    for container, prefixes in (
        ("clocks_event_reasons", ("clocks_event_reason_",)),
        ("clocks_throttle_reasons", ("clocks_throttle_reason_", "clocks_event_reason_")),
    ):
        elem = gpu.find(container)
        if elem is None:
            continue
        for child in elem:
            name = child.tag
            for prefix in prefixes:
                if name.startswith(prefix):
                    name = name[len(prefix):]
                    break
            if name == "gpu_idle":
                continue
            if (clean(child.text) or "").lower() == "active" and name not in active:
                active.append(name)
    return active


def _ecc(gpu):
    mode = _text(gpu, "ecc_mode/current_ecc")
    out = {"mode": mode}
    for scope in ("volatile", "aggregate"):
        base = "ecc_errors/" + scope
        elem = gpu.find(base)
        unc = corr = None
        if elem is not None:
            for child in elem:
                n = to_int(clean(child.text))
                if n is None:
                    continue
                tag = child.tag
                if "uncorrectable" in tag or tag.startswith("double_bit"):
                    unc = (unc or 0) + n
                elif "correctable" in tag or tag.startswith("single_bit"):
                    corr = (corr or 0) + n
            # old drivers: <single_bit><total>, <double_bit><total>
            for sub, key in (("single_bit/total", "corr"), ("double_bit/total", "unc")):
                n = to_int(_text(elem, sub))
                if n is not None:
                    if key == "corr":
                        corr = (corr or 0) + n
                    else:
                        unc = (unc or 0) + n
        out[scope + "_uncorrectable"] = unc
        out[scope + "_correctable"] = corr
    return {
        "mode": out["mode"],
        "volatile_uncorrectable": out["volatile_uncorrectable"],
        "aggregate_uncorrectable": out["aggregate_uncorrectable"],
        "volatile_correctable": out["volatile_correctable"],
        "aggregate_correctable": out["aggregate_correctable"],
    }


def _retired_pages(gpu):
    rp = gpu.find("retired_pages")
    single = to_int(_text(rp, "multiple_single_bit_retirement/retired_count"))
    double = to_int(_text(rp, "double_bit_retirement/retired_count"))
    pending_txt = _text(rp, "pending_retirement") or _text(rp, "pending_blacklist")
    return {"single_bit": single, "double_bit": double, "pending": _yes_no(pending_txt)}


def _remapped_rows(gpu):
    rr = gpu.find("remapped_rows")
    return {
        "correctable": to_int(_text(rr, "remapped_row_corr")),
        "uncorrectable": to_int(_text(rr, "remapped_row_unc")),
        "pending": _yes_no(_text(rr, "remapped_row_pending")),
        "failure": _yes_no(_text(rr, "remapped_row_failure")),
    }


def _fabric(gpu):
    fab = gpu.find("fabric")
    if fab is None:
        return {"state": None, "status": None, "clique_id": None, "cluster_uuid": None, "health": {}}
    health = {}
    h = fab.find("health")
    if h is not None:
        for child in h:
            health[child.tag] = clean(child.text)
    return {
        "state": _text(fab, "state"),
        "status": _text(fab, "status"),
        "clique_id": _text(fab, "cliqueId") or _text(fab, "clique_id"),
        "cluster_uuid": _text(fab, "clusterUuid") or _text(fab, "cluster_uuid"),
        "health": health,
    }


def _temperatures(gpu):
    t = gpu.find("temperature")
    # absolute thresholds (most drivers); 580+ on Hopper/Blackwell may print only T.Limit-relative values,
    # which are NOT absolute temperatures: they stay None then and temp_tlimit_c carries the headroom.
    return {
        "temperature_c": to_int(_text(t, "gpu_temp")),
        "temp_slowdown_c": to_int(_text(t, "gpu_temp_slow_threshold")),
        "temp_shutdown_c": to_int(_text(t, "gpu_temp_max_threshold")),
        "temp_max_gpu_c": to_int(_text(t, "gpu_temp_max_gpu_threshold") or _text(t, "gpu_target_temperature")),
        "temp_tlimit_c": to_int(_text(t, "gpu_temp_tlimit")),
    }


def _power_limit(gpu):
    for path in ("gpu_power_readings/current_power_limit", "power_readings/power_limit",
                 "gpu_power_readings/enforced_power_limit", "power_readings/enforced_power_limit"):
        v = to_float(_text(gpu, path))
        if v is not None:
            return v
    return None


def parse_smi_xml(text):
    """Parse ``nvidia-smi -q -x``. Returns {driver_version, cuda_version, attached_gpus, gpus: [...]}.

    Raises ValueError when the text is not nvidia-smi XML.
    """
    if not text or not text.strip():
        raise ValueError("empty output")
    try:
        root = ET.fromstring(text.strip().encode("utf-8") if isinstance(text, str) else text)
    except ET.ParseError as exc:
        raise ValueError("not XML: %s" % exc) from exc
    if root.tag != "nvidia_smi_log":
        raise ValueError("unexpected root element <%s> (expected <nvidia_smi_log>)" % root.tag)
    gpus = []
    for index, gpu in enumerate(root.findall("gpu")):
        pci = normalize_pci_bus_id(_text(gpu, "pci/pci_bus_id") or gpu.get("id"))
        numa_txt = _text(gpu, "numa_node") or _text(gpu, "pci/numa_node")
        entry = {
            "index": index,
            "name": _text(gpu, "product_name"),
            "uuid": _text(gpu, "uuid"),
            "pci_bus_id": pci,
            "numa_node": to_int(numa_txt),
            "memory_total_mib": to_int(_text(gpu, "fb_memory_usage/total")),
            "vbios_version": _text(gpu, "vbios_version"),
        }
        entry.update(_temperatures(gpu))
        reasons = _clock_reasons(gpu)
        entry.update({
            "power_limit_w": _power_limit(gpu),
            "clock_event_reasons_active": reasons,
            "throttled": any(r in DEFAULT_GATE_THROTTLE_REASONS for r in reasons),
            "ecc": _ecc(gpu),
            "retired_pages": _retired_pages(gpu),
            "remapped_rows": _remapped_rows(gpu),
            "fabric": _fabric(gpu),
        })
        gpus.append(entry)
    return {
        "driver_version": _first_tag(root, DRIVER_VERSION_TAGS),
        "cuda_version": _first_tag(root, CUDA_VERSION_TAGS),
        "attached_gpus": to_int(_text(root, "attached_gpus")),
        "gpus": gpus,
    }


# --------------------------------------------------------------------------- topo -m
class TopoParseError(ValueError):
    """A ``nvidia-smi topo -m`` row that cannot be made to fit its header (the message names the row)."""


# cell vocabulary (nvidia-smi topo -m, all drivers seen so far)
LINK_RE = re.compile(r"^(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|C2C|N/A)$")
_CPU_RANGE = r"\d+(?:-\d+)?"
CPU_LIST_RE = re.compile(r"^(?:%s(?:,%s)*|N/A)$" % (_CPU_RANGE, _CPU_RANGE))
NUMA_ID_RE = re.compile(r"^(?:\d+|N/A)$")
ANY_CELL_RE = re.compile(r"^\S+$")
NAMED_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NAMED_RE = {"CPU Affinity": CPU_LIST_RE, "NUMA Affinity": NUMA_ID_RE, "GPU NUMA ID": NUMA_ID_RE}
# a device column in the header: GPUn, NICn (with a NIC Legend) or an RDMA device named directly (old drivers:
# mlx5_0, mlx4_0, bnxt_re0, irdma0, ...)
_DEV_COL_RE = re.compile(r"GPU\d+|NIC\d+|[a-z][a-z0-9]*_[a-z0-9]*?\d+|[a-z]+\d+")
_ROW_LABEL_RE = re.compile(r"^\s*(GPU\d+|NIC\d+|[a-z][a-z0-9]*_\d+)(?=\s|$)")


def _cpu_list_ok(value):
    """A CPU list whose ranges run upwards (``144-191``, never ``144-19``)."""
    if value == "N/A":
        return True
    for part in value.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            if int(lo) >= int(hi):
                return False
    return True


def _header_columns(line):
    """Column names of a header line, or None when the line is no header.

    Accepts a leading tab, spaces or nothing, ANSI escapes (stripped before), tabs or spaces between names and
    device names glued together (``mlx5_10mlx5_11``)."""
    m = re.search(r"(?<![A-Za-z0-9_])GPU0(?![0-9])", line)
    if not m:
        return None
    text = line[m.start():]
    named = []
    for label in NAMED_COLUMNS:
        pos = text.find(label)
        if pos >= 0:
            named.append((pos, label))
    named.sort()
    dev_text = text[:named[0][0]] if named else text
    rest = text[named[0][0]:] if named else ""
    devs = []
    for chunk in dev_text.split():
        pieces = _DEV_COL_RE.findall(chunk)
        if "".join(pieces) != chunk:
            return None  # something that is not a column name: not a header
        devs.extend(pieces)
    if not devs or devs[0] != "GPU0" or "X" in devs:
        return None
    # every other named column (future drivers) by two or more blanks / tabs
    named_cols = [label for _pos, label in named]
    leftover = rest
    for label in named_cols:
        leftover = leftover.replace(label, "\t")
    extra = [c for c in re.split(r"\t|\s{2,}", leftover) if c.strip()]
    if len(devs) == 1 and not named_cols:
        return None  # a lone "GPU0" is a row label or prose, not a header
    return devs, named_cols + [c.strip() for c in extra]


def _fits(chunks, slots, prefer):
    """Split whitespace-separated ``chunks`` (each possibly several glued cells) into len(slots) cells.

    slots: list of (name, regex, check). Returns the list of cells, or None when no split fits. When several
    splits fit, ``prefer`` (a key function over the cell list) chooses; the choice is deterministic."""
    text = "\x00".join(chunks)
    n = len(slots)
    memo = {}

    def solve(pos, k):
        # all ways to cut text[pos:] into slots[k:]; cells never cross a chunk boundary (\x00)
        key = (pos, k)
        if key in memo:
            return memo[key]
        out = []
        if k == n:
            if pos == len(text):
                out = [[]]
        elif pos < len(text):
            _name, rx, check = slots[k]
            end = pos + 1
            while end <= len(text):
                if text[end - 1] == "\x00":
                    break
                cell = text[pos:end]
                if rx.match(cell) and (check is None or check(cell)):
                    nxt = end
                    if nxt < len(text) and text[nxt] == "\x00":
                        nxt += 1  # the cell ends its chunk; the next cell starts the next chunk
                    for tail in solve(nxt, k + 1):
                        out.append([cell] + tail)
                        if len(out) > 64:
                            break
                end += 1
        memo[key] = out
        return out

    ways = solve(0, 0)
    if not ways:
        return None
    return sorted(ways, key=prefer)[0]


def parse_topo(text):
    """Parse ``nvidia-smi topo -m``.

    Returns {nic_columns_present, gpus, nics, gpu_gpu, gpu_nic, cpu_affinity, numa_affinity, gpu_numa_id,
    nic_legend}. GPU keys are index strings, NIC keys are legend names (``mlx5_0``) or the column name when the
    header names the device itself (older drivers: ``mlx5_0`` columns, no legend).

    Cells are read by their vocabulary (X, NV<n>, PIX, PXB, PHB, NODE, SYS, SOC, N/A, CPU lists, NUMA ids), not by
    tab position: tabs or spaces, a header without its leading tab, ANSI escapes and cells glued together by
    drivers 525-570 (``PIXPHB``, ``0N/A``, ``48-95,144-1911N/A``) all read the same. The header's column count and
    the row structure (matrix cells, CPU affinity, NUMA affinity[, GPU NUMA ID]) decide how a glued token splits;
    a GPU row that cannot be made to fit raises :class:`TopoParseError` naming the row.

    Long on purpose (issue 39 keeps at most three functions of 100 lines): one pass over the
    header and the rows, the glued-token splitting beside the row structure it depends on; split, the column state
    would be passed between the pieces.
    """
    out = {"nic_columns_present": False, "gpus": [], "nics": [], "gpu_gpu": {}, "gpu_nic": {},
           "cpu_affinity": {}, "numa_affinity": {}, "gpu_numa_id": {}, "nic_legend": {}}
    if not text:
        return out
    lines = [ANSI_RE.sub("", ln).replace("\r", "").replace("\xa0", " ") for ln in text.splitlines()]
    legend = {}
    for ln in lines:
        m = re.match(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$", ln)
        if m:
            legend[m.group(1)] = m.group(2)
    out["nic_legend"] = legend
    header = None
    for i, ln in enumerate(lines):
        cols = _header_columns(ln)
        if cols:
            header = (i, cols)
            break
    if header is None:
        return out
    hidx, (dev_cols, named_cols) = header
    nic_cols = [c for c in dev_cols if not c.startswith("GPU")]
    gpu_cols = [c for c in dev_cols if c.startswith("GPU")]
    out["nic_columns_present"] = bool(nic_cols)
    out["nics"] = [legend.get(c, c) for c in nic_cols]
    slots = [(c, LINK_RE, None) for c in dev_cols]
    slots += [(c, _NAMED_RE.get(c, ANY_CELL_RE), _cpu_list_ok if c == "CPU Affinity" else None) for c in named_cols]
    seen_cpu = {}
    seen_rows = set()
    body = lines[hidx + 1:]

    for pos, ln in enumerate(body):
        if not ln.strip():
            # a blank line ends the matrix, unless the next non-blank line is a row of this header not read yet
            # (markdown copies put an empty line between rows)
            if out["gpus"] and not _row_follows(body, pos + 1, dev_cols, seen_rows):
                break
            continue
        if re.match(r"^\s*Legend\s*:", ln):
            break
        m = _ROW_LABEL_RE.match(ln)
        if not m:
            if out["gpus"]:
                break
            continue
        label = m.group(1)
        if label in seen_rows:
            break  # a second copy of the matrix (same row again): the first one is read
        seen_rows.add(label)
        if not label.startswith("GPU"):
            continue  # NIC rows repeat the GPU/NIC cells; they are not needed
        if label not in gpu_cols:
            raise TopoParseError("nvidia-smi topo -m: row %s has no column in the header (%s)" % (
                label, " ".join(dev_cols)))
        chunks = ln[m.end():].split()
        cells = _fits(chunks, slots, lambda cells: _prefer(cells, len(dev_cols), named_cols, seen_cpu))
        if cells is None:
            cells = _fit_leading_blanks(ln[m.end():], chunks, slots, len(dev_cols), named_cols,
                                        lambda c: _prefer(c, len(dev_cols), named_cols, seen_cpu))
        if cells is None:
            # trailing named columns may be missing altogether (blank CPU affinity on some VMs)
            for drop in range(1, len(named_cols) + 1):
                cells = _fits(chunks, slots[:len(slots) - drop],
                              lambda c: _prefer(c, len(dev_cols), named_cols, seen_cpu))
                if cells is not None:
                    cells = cells + [None] * drop
                    break
        if cells is None:
            raise TopoParseError(
                "nvidia-smi topo -m: row %s does not fit the header's %d columns (%s): %r" % (
                    label, len(slots), ", ".join(dev_cols + named_cols), ln.strip()))
        gpu = label[3:]
        if cells[dev_cols.index(label)] != "X":
            raise TopoParseError("nvidia-smi topo -m: row %s: expected X in its own column %s, got %r" % (
                label, label, cells[dev_cols.index(label)]))
        out["gpus"].append(gpu)
        for col, val in zip(dev_cols, cells[:len(dev_cols)]):
            if val == "X":
                continue
            if col.startswith("GPU"):
                out["gpu_gpu"].setdefault(gpu, {})[col[3:]] = val
            else:
                out["gpu_nic"].setdefault(gpu, {})[legend.get(col, col)] = val
        named = dict(zip(named_cols, cells[len(dev_cols):]))
        for col, key in (("CPU Affinity", "cpu_affinity"), ("NUMA Affinity", "numa_affinity"),
                         ("GPU NUMA ID", "gpu_numa_id")):
            if col in named:
                out[key][gpu] = clean(named[col])
        if named.get("CPU Affinity") and named.get("NUMA Affinity"):
            seen_cpu.setdefault(named["CPU Affinity"], named["NUMA Affinity"])
    return out


def _fit_leading_blanks(rest, chunks, slots, n_dev, named_cols, prefer):
    """Tab-separated row whose first named cells are empty (``SYS\t\t\t\tN/A``: no CPU and no NUMA affinity, GPU
    NUMA ID N/A). When the tab fields after the device cells start with empty fields, those empty fields are the
    first named columns (never shift a later value such as the GPU NUMA ID into CPU Affinity). None when the row is
    not laid out that way."""
    if "\t" not in rest:
        return None
    fields = rest.split("\t")
    if fields and not fields[0].strip():
        fields = fields[1:]  # the tab after the row label
    dev = [f.strip() for f in fields[:n_dev]]
    if len(dev) < n_dev or not all(LINK_RE.match(c) for c in dev):
        return None  # glued or missing device cells: no tab positions to rely on
    tail = [f.strip() for f in fields[n_dev:]]
    filled = [f for f in tail if f]
    leading = 0
    for f in tail:
        if f:
            break
        leading += 1
    blanks = min(leading, len(named_cols) - len(filled))
    if not leading or blanks <= 0:
        return None
    kept = slots[:n_dev] + slots[n_dev + blanks:]
    cells = _fits(chunks, kept, lambda c: prefer(c[:n_dev] + [None] * blanks + c[n_dev:]))
    if cells is None:
        return None
    return cells[:n_dev] + [None] * blanks + cells[n_dev:]


def _row_follows(body, start, dev_cols, seen_rows):
    """True when the next non-blank line from ``start`` is a matrix row of this header not read yet."""
    for ln in body[start:]:
        if not ln.strip():
            continue
        m = _ROW_LABEL_RE.match(ln)
        return bool(m) and m.group(1) in dev_cols and m.group(1) not in seen_rows
    return False


def _prefer(cells, n_dev, named_cols, seen_cpu):
    """Order of preference between splits that all fit: a CPU list already seen in another row, then the
    shortest NUMA id (``1`` rather than ``11`` when ``144-191`` + ``1`` and ``144-19``... both parse)."""
    named = dict(zip(named_cols, cells[n_dev:]))
    cpu = named.get("CPU Affinity") or ""
    numa = named.get("NUMA Affinity") or ""
    return (0 if cpu in seen_cpu else 1, len(numa), -len(cpu), cells)


# --------------------------------------------------------------------------- nvlink -s
def parse_nvlink_status(text):
    """Parse ``nvidia-smi nvlink -s``: {gpu_index(int): {link(int): speed_gbps(float) or None when inactive}}.

    Empty output (single GPU, no NVLink) gives {}.
    """
    out = {}
    current = None
    for ln in (text or "").splitlines():
        ln = ANSI_RE.sub("", ln)
        m = re.match(r"^\s*GPU\s+(\d+)\s*:", ln)
        if m:
            current = int(m.group(1))
            out.setdefault(current, {})
            continue
        m = re.match(r"^\s*Link\s+(\d+)\s*:\s*(.*?)\s*$", ln)
        if m and current is not None:
            val = m.group(2)
            speed = None
            sm = re.match(r"^(\d+(?:\.\d+)?)\s*GB/s", val)
            if sm:
                speed = float(sm.group(1))
            out[current][int(m.group(1))] = speed
    return out


def nvlink_summary(links):
    """Per-GPU NVLink summary from {link: speed or None}."""
    up = sorted(n for n, s in links.items() if s is not None)
    down = sorted(n for n, s in links.items() if s is None)
    speeds = [links[n] for n in up]
    speed = None
    if speeds:
        # most common per-link speed, ties -> the lowest (conservative)
        speed = sorted(set(speeds), key=lambda s: (-speeds.count(s), s))[0]
    return {"links_total": len(links), "links_up": len(up), "links_down": len(down),
            "down_links": down, "speed_gbps": speed}


# --------------------------------------------------------------------------- sysfs
def sysfs_numa_node(sysfs_root, pci_bus_id):
    """NUMA node of a PCI device from ``<sysfs_root>/bus/pci/devices/<addr>/numa_node`` (-1/absent -> None)."""
    if not pci_bus_id:
        return None
    path = os.path.join(sysfs_root or "/sys", "bus", "pci", "devices", pci_bus_id, "numa_node")
    try:
        with open(path) as fh:
            n = int(fh.read().strip())
    except (OSError, ValueError):
        return None
    return n if n >= 0 else None


def _single_int(value):
    if value is None:
        return None
    return int(value) if re.match(r"^\d+$", value.strip()) else None


def _sysfs_ib_devices(sysfs_root):
    """{name: (pci_address, numa_node)} of ``<sysfs_root>/class/infiniband/*`` (the same tree rdma_nic_facts reads)."""
    base = os.path.join(sysfs_root or "/sys", "class", "infiniband")
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return {}
    out = {}
    for name in names:
        dev = os.path.join(base, name, "device")
        if not os.path.exists(dev):
            continue
        pci = normalize_pci_bus_id(os.path.basename(os.path.realpath(dev)))
        out[name] = (pci, sysfs_numa_node(sysfs_root, pci))
    return out


def affinity_disagreements(gpus, topo, sysfs_root):
    """Compare the nearest NIC(s) per GPU from ``topo -m`` with sysfs (PCIe path, else NUMA node).

    Returns (disagreements, sysfs_rows): disagreements = [{gpu, topo_nic, sysfs_nic, reason}] where the two nearest
    sets share no NIC; sysfs_rows = {gpu: {nic: level}} from sysfs for those GPUs (the caller prefers them).
    Only NICs named both in topo and in sysfs are compared; nothing is reported when sysfs knows none of them."""
    from ansible_collections.b300.rollout.plugins.module_utils.hw.affinity import LEVEL_RANK, _sysfs_rank  # the no-NIC-column fallback, reused

    levels = {v: k for k, v in LEVEL_RANK.items()}
    devs = _sysfs_ib_devices(sysfs_root)
    out, rows = [], {}
    for g in gpus:
        key = str(g["index"])
        cells = {n: v for n, v in (topo.get("gpu_nic") or {}).get(key, {}).items() if v in LEVEL_RANK and n in devs}
        if not cells or not g.get("pci_bus_id"):
            continue
        gnuma = sysfs_numa_node(sysfs_root, g["pci_bus_id"])
        if gnuma is None:
            gnuma = g.get("numa_node")
        sysfs_rank, how = {}, {}
        for n in cells:
            nic_pci, nic_numa = devs[n]
            r = _sysfs_rank(g["pci_bus_id"], nic_pci, sysfs_root)
            if r is not None:
                sysfs_rank[n], how[n] = r, "PCIe path"
            elif gnuma is not None and nic_numa is not None:
                sysfs_rank[n], how[n] = LEVEL_RANK["NODE"] if gnuma == nic_numa else LEVEL_RANK["SYS"], "NUMA node"
        if not sysfs_rank:
            continue
        tbest = min(LEVEL_RANK[v] for n, v in cells.items() if n in sysfs_rank)
        sbest = min(sysfs_rank.values())
        tset = sorted(n for n in sysfs_rank if LEVEL_RANK[cells[n]] == tbest)
        sset = sorted(n for n, r in sysfs_rank.items() if r == sbest)
        if set(tset) & set(sset):
            continue
        out.append({"gpu": g["index"], "topo_nic": tset, "sysfs_nic": sset,
                    "reason": "nvidia-smi topo -m puts %s nearest (%s) but sysfs (%s) puts %s nearest (%s); "
                              "using sysfs" % (",".join(tset), levels[tbest], how[sset[0]], ",".join(sset),
                                               levels[sbest])})
        rows[key] = {n: levels[r] for n, r in sysfs_rank.items()}
    return out, rows


# --------------------------------------------------------------------------- build + health
def build_gpu_topology(xml_text, topo_text, nvlink_text, sysfs_root="/sys", banner_text=None):
    """Build the ``gpu_topology`` fact. Raises ValueError when the XML is unreadable."""
    smi = parse_smi_xml(xml_text)
    topo = parse_topo(topo_text)
    nvl = parse_nvlink_status(nvlink_text)
    driver = smi["driver_version"]
    cuda = smi["cuda_version"]
    if (driver is None or cuda is None) and banner_text:
        b = parse_banner(banner_text)
        driver = driver or b["driver_version"]
        cuda = cuda or b["cuda_version"]
    gpus = []
    for g in smi["gpus"]:
        key = str(g["index"])
        if g["numa_node"] is None:
            g["numa_node"] = _single_int(topo["numa_affinity"].get(key))
        if g["numa_node"] is None:
            g["numa_node"] = sysfs_numa_node(sysfs_root, g["pci_bus_id"])
        g["nvlink"] = nvlink_summary(nvl.get(g["index"], {}))
        gpus.append(g)
    disagreements, sysfs_rows = affinity_disagreements(gpus, topo, sysfs_root)
    gpu_nic = {k: dict(v) for k, v in topo["gpu_nic"].items()}
    for key, row in sysfs_rows.items():
        gpu_nic.setdefault(key, {}).update(row)  # sysfs wins where the two disagree
    result = {
        "driver_version": driver,
        "cuda_version": cuda,
        "gpu_count": len(gpus),
        "gpus": gpus,
        "topology": {
            "nic_columns_present": topo["nic_columns_present"],
            "gpu_gpu": topo["gpu_gpu"],
            "gpu_nic": gpu_nic,
            "cpu_affinity": topo["cpu_affinity"],
            "numa_affinity": topo["numa_affinity"],
        },
        "affinity_disagreements": disagreements,
    }
    result["problems"] = [p["message"] for p in health_problems(result)]
    return result


HEALTH_CHECKS = ("gpu_count", "gpu_model", "nvlink", "ecc", "remapped_rows", "throttle", "fabric")

# Clock-event reasons the gate counts as throttling: hardware slowdown, thermal and power brake. sw_power_cap is not
# among them: a loaded GPU sits at its power cap by design (the thermal soak does not count it either); it is reported
# as information (health_notes), not as a problem. expected.throttle_reasons replaces this list.
DEFAULT_GATE_THROTTLE_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown")


class _Problems(object):
    """Collects problem dicts; the policy of each check decides its severity (or drops it)."""

    def __init__(self, policies, host):
        self.policies = policies or {}
        self.host = host
        self.items = []

    def add(self, check, gpu, exp, actual, text):
        severity = self.policies.get(check, "fail")
        if severity == "ignore":
            return
        prefix = "%s: " % self.host if self.host else ""
        where = "GPU %s (%s): " % (gpu["index"], gpu.get("pci_bus_id")) if gpu is not None else ""
        self.items.append({
            "host": self.host, "gpu": gpu["index"] if gpu is not None else None,
            "pci": gpu.get("pci_bus_id") if gpu is not None else None,
            "check": check, "severity": severity, "expected": exp, "actual": actual,
            "message": "%s%s%s" % (prefix, where, text),
        })


def _check_gpu_count(gpu_topology, gpus, expected, out):
    exp_count = expected.get("gpu_count")
    count = gpu_topology.get("gpu_count", len(gpus))
    if exp_count is not None and count != exp_count:
        out.add("gpu_count", None, exp_count, count, "%d GPUs visible to nvidia-smi, expected %d" % (count, exp_count))


def _check_gpu_model(g, expected, out):
    exp_model = expected.get("gpu_model")
    if exp_model and g.get("name") != exp_model:
        out.add("gpu_model", g, exp_model, g.get("name"), "model %r, expected %r" % (g.get("name"), exp_model))


def _check_nvlink(g, expected, out):
    exp_links = expected.get("nvlink_links")
    nv = g.get("nvlink") or {}
    down = nv.get("down_links") or []
    up = nv.get("links_up") or 0
    if not down and not (exp_links is not None and up < exp_links):
        return
    exp_txt = exp_links if exp_links is not None else nv.get("links_total")
    missing = (exp_links - (nv.get("links_total") or 0)) if exp_links is not None else 0
    detail = "links %s" % ", ".join(str(n) for n in down) if down else "no inactive links listed"
    if missing > 0:
        detail += "; %d links not reported" % missing
    out.add("nvlink", g, exp_txt, up, "%d NVLink links down (%s); expected %s links up, %d up" % (
        (exp_txt or 0) - up if exp_txt is not None else len(down), detail, exp_txt, up))


def _check_ecc(g, out):
    ecc = g.get("ecc") or {}
    vol = ecc.get("volatile_uncorrectable") or 0
    agg = ecc.get("aggregate_uncorrectable") or 0
    if vol or agg:
        out.add("ecc", g, 0, {"volatile": vol, "aggregate": agg},
                "uncorrectable ECC errors: volatile %d, aggregate %d; expected 0" % (vol, agg))


def _check_remapped_rows(g, out):
    rr = g.get("remapped_rows") or {}
    if rr.get("failure") or rr.get("pending"):
        what = " and ".join(w for w, flag in (("remap failure", rr.get("failure")),
                                              ("remap pending (reset needed)", rr.get("pending"))) if flag)
        out.add("remapped_rows", g, "no failure, no pending", {"failure": rr.get("failure"), "pending": rr.get("pending")},
                "row remapping: %s (%s uncorrectable rows remapped); expected no failure and nothing pending" % (
                    what, rr.get("uncorrectable")))


def gate_throttle_reasons(expected):
    """The clock-event reasons the gate counts: expected.throttle_reasons, else DEFAULT_GATE_THROTTLE_REASONS."""
    reasons = (expected or {}).get("throttle_reasons")
    return tuple(reasons) if reasons is not None else DEFAULT_GATE_THROTTLE_REASONS


def _check_throttle(g, expected, out):
    counted = gate_throttle_reasons(expected)
    active = [r for r in g.get("clock_event_reasons_active") or [] if r in counted]
    if active:
        out.add("throttle", g, [], active, "clocks throttled by %s (temperature %s C, power limit %s W); expected none" % (
            ", ".join(active), g.get("temperature_c"), g.get("power_limit_w")))


def _check_fabric(g, expected, out):
    exp_fabric = expected.get("fabric_state", "Completed")
    state = (g.get("fabric") or {}).get("state")
    if exp_fabric and state != exp_fabric and (state is not None or expected.get("fabric_required")):
        out.add("fabric", g, exp_fabric, state, "fabric state %s (status %s), expected %s; fix: nvidia-fabricmanager "
                "running and done (systemctl status nvidia-fabricmanager; journalctl -u nvidia-fabricmanager)" % (
                    state if state is not None else "not reported", (g.get("fabric") or {}).get("status") or "N/A",
                    exp_fabric))


def health_problems(gpu_topology, expected=None, policies=None, host=None):
    """Check a ``gpu_topology`` fact; return a list of problem dicts.

    expected: {gpu_count: int|None, gpu_model: str|None, nvlink_links: int|None (links per GPU),
               fabric_state: str (default "Completed"), fabric_required: bool (default False: a GPU that
               reports no fabric state at all passes), throttle_reasons: [str] (default
               DEFAULT_GATE_THROTTLE_REASONS)}. Missing keys -> that expectation is not checked
               (the NVLink check then only reports links listed as inactive).
    policies: {check: "fail"|"warn"|"ignore"} for the checks in HEALTH_CHECKS (default "fail").
    Each problem: {host, gpu, pci, check, severity, expected, actual, message}; gpu/pci are None for
    host-wide checks. Problems whose policy is "ignore" are dropped.
    """
    expected = expected or {}
    gpus = gpu_topology.get("gpus") or []
    out = _Problems(policies, host)
    _check_gpu_count(gpu_topology, gpus, expected, out)
    for g in gpus:
        _check_gpu_model(g, expected, out)
        _check_nvlink(g, expected, out)
        _check_ecc(g, out)
        _check_remapped_rows(g, out)
        _check_throttle(g, expected, out)
        _check_fabric(g, expected, out)
    return out.items


def health_notes(gpu_topology, expected=None, host=None):
    """Information that is not a problem: clock-event reasons active but not gated (sw_power_cap on a loaded GPU)."""
    counted = gate_throttle_reasons(expected)
    prefix = "%s: " % host if host else ""
    notes = []
    for g in gpu_topology.get("gpus") or []:
        other = [r for r in g.get("clock_event_reasons_active") or [] if r in THROTTLE_REASONS and r not in counted]
        if other:
            notes.append("%sGPU %s (%s): clock-event reason(s) %s active (normal under load; not gated)"
                         % (prefix, g["index"], g.get("pci_bus_id"), ", ".join(other)))
    return notes
