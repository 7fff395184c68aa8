#!/usr/bin/env python3
"""Venv coherence check of an SGLang server venv (run on its host by the sglang role after every install; stdlib only,
read-only).

  sglang_venv_check.py --venv /opt/sglang/0.5.17 --host b300a [--expect-cuda-major 13] [--check-libs]
                       [--import mooncake.engine] [--package mooncake-transfer-engine-cuda13]

Checks, without importing torch:
  (a) the CUDA major of the venv's torch, read from torch/version.py (`cuda = '13.0'`); without torch (a test
      double's venv) the expected major given by --expect-cuda-major is the reference;
  (b) every shared object of the venv that has NEEDED libcudart.so.N (the transfer engine's engine.so among them)
      links the reference major; with --check-libs, every NEEDED library of those objects and of the --package
      distribution's objects resolves (RPATH/RUNPATH with $ORIGIN, LD_LIBRARY_PATH, ld.so.cache, the default dirs,
      or the CUDA wheels under site-packages/nvidia that torch loads first);
  (c) with --import (only when torch is real), the venv's python imports that module.
Prints one JSON line {"ok", "torch_cuda_major", "reference_major", "checked", "problems": [...]}; exit 0 ok, 2 not.
Each problem names the host, the distribution, the file, both CUDA majors (or the missing library) and the fix.
"""
import argparse
import glob
import json
import os
import re
import struct
import subprocess
import sys

DT_NEEDED, DT_RPATH, DT_RUNPATH, DT_STRTAB, DT_STRSZ = 1, 15, 29, 5, 10
PT_LOAD, PT_DYNAMIC = 1, 2
DEFAULT_DIRS = ["/lib", "/usr/lib", "/lib64", "/usr/lib64", "/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
                "/usr/local/lib"]
CUDART = re.compile(r"^libcudart\.so\.(\d+)$")
# the CUDA 13 build of a distribution that ships a CUDA 12 one under the plain name
CUDA_VARIANTS = {"mooncake-transfer-engine": "mooncake-transfer-engine-cuda{major}"}


def elf_dynamic(path):
    """(needed, rpath_dirs) of an ELF shared object, parsed from its program headers; None when not ELF."""
    with open(path, "rb") as fh:
        ident = fh.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            return None
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            hdr = struct.unpack(end + "HHIQQQIHHHHHH", fh.read(48))
            phoff, phentsize, phnum = hdr[4], hdr[8], hdr[9]
        else:
            hdr = struct.unpack(end + "HHIIIIIHHHHHH", fh.read(36))
            phoff, phentsize, phnum = hdr[4], hdr[8], hdr[9]
        loads, dyn = [], None
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            if is64:
                p_type, _fl, p_offset, p_vaddr, _pa, p_filesz, _mem, _al = struct.unpack(end + "IIQQQQQQ", fh.read(56))
            else:
                p_type, p_offset, p_vaddr, _pa, p_filesz, _mem, _fl, _al = struct.unpack(end + "IIIIIIII", fh.read(32))
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC:
                dyn = (p_offset, p_filesz)
        if dyn is None:
            return [], []
        fh.seek(dyn[0])
        raw = fh.read(dyn[1])
        fmt, size = (end + "qQ", 16) if is64 else (end + "iI", 8)
        entries = [struct.unpack(fmt, raw[i:i + size]) for i in range(0, len(raw) - size + 1, size)]
        strtab = next((v for t, v in entries if t == DT_STRTAB), None)
        strsz = next((v for t, v in entries if t == DT_STRSZ), 0)
        if strtab is None:
            return [], []
        off = next((o + strtab - va for va, o, sz in loads if va <= strtab < va + sz), strtab)
        fh.seek(off)
        strings = fh.read(strsz)

    def s(i):
        return strings[i:strings.index(b"\0", i)].decode("utf-8", "replace")
    needed = [s(v) for t, v in entries if t == DT_NEEDED]
    rpath = [d for t, v in entries if t in (DT_RPATH, DT_RUNPATH) for d in s(v).split(":") if d]
    return needed, rpath


def torch_cuda_major(site):
    """CUDA major of torch in site-packages, read from torch/version.py; None without torch or for a CPU build."""
    try:
        with open(os.path.join(site, "torch", "version.py")) as fh:
            text = fh.read()
    except OSError:
        return None
    m = re.search(r"^cuda\b[^=\n]*=\s*['\"](\d+)\.", text, re.M)
    return int(m.group(1)) if m else None


def dist_owners(site):
    """relative path -> distribution name, from every *.dist-info/RECORD."""
    owners = {}
    for record in glob.glob(os.path.join(site, "*.dist-info", "RECORD")):
        name = None
        try:
            with open(os.path.join(os.path.dirname(record), "METADATA"), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if line.startswith("Name:"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        name = name or os.path.basename(os.path.dirname(record)).split("-")[0]
        with open(record, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                owners[os.path.normpath(line.split(",", 1)[0])] = name
    return owners


def ld_cache():
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        try:
            out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, timeout=30,
                                 check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return set()
    return {line.strip().split(" ", 1)[0] for line in out.splitlines()[1:] if line.strip()}


def resolves(lib, origin, rpath, cache, venv_libs):
    if "/" in lib:
        return os.path.exists(lib)
    dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for d in rpath]
    dirs += [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(":") if d]
    if any(os.path.exists(os.path.join(d, lib)) for d in dirs):
        return True
    return lib in cache or lib in venv_libs or any(os.path.exists(os.path.join(d, lib)) for d in DEFAULT_DIRS)


def fix_for(dist, found, ref):
    variant = CUDA_VARIANTS.get((dist or "").lower().replace("_", "-"))
    if variant:
        return "install %s (sglang_mooncake_package) instead of %s" % (variant.format(major=ref), dist)
    return "install the CUDA %s build of %s" % (ref, dist)


def check(venv, host, expect_major=None, check_libs=False, packages=(), import_module=None, python=None):
    sites = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")))
    problems = []
    if not sites:
        return {"ok": False, "problems": ["%s: %s has no lib/python3*/site-packages: not a venv" % (host, venv)]}
    site = sites[0]
    torch_major = torch_cuda_major(site)
    ref = torch_major if torch_major is not None else expect_major
    ref_src = "torch %s in %s" % (torch_major, site) if torch_major is not None else "expected %s" % expect_major
    if torch_major is not None and expect_major is not None and torch_major != expect_major:
        problems.append("%s: torch in %s is a CUDA %s build, this SGLang version needs CUDA %s; fix: reinstall the venv "
                        "from a wheelhouse with the CUDA %s torch" % (host, venv, torch_major, expect_major,
                                                                      expect_major))
    owners = dist_owners(site)
    wanted = {p.lower().replace("_", "-") for p in packages}
    # libraries torch loads before anything else in the process (its own and the CUDA wheels'): found by soname
    venv_libs = {os.path.basename(p) for sub in ("nvidia", "torch")
                 for p in glob.glob(os.path.join(site, sub, "**", "*.so*"), recursive=True)}
    cache = ld_cache() if check_libs else set()
    checked = 0
    for path in sorted(glob.glob(os.path.join(site, "**", "*.so*"), recursive=True)):
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        try:
            parsed = elf_dynamic(path)
        except (OSError, struct.error, ValueError):
            continue
        if parsed is None:
            continue
        needed, rpath = parsed
        rel = os.path.relpath(path, site)
        dist = owners.get(os.path.normpath(rel), "?")
        majors = [int(CUDART.match(n).group(1)) for n in needed if CUDART.match(n)]
        in_pkg = dist.lower().replace("_", "-") in wanted
        if not majors and not in_pkg:
            continue
        checked += 1
        for found in majors:
            if ref is not None and found != ref:
                problems.append(
                    "%s: %s (%s) links libcudart.so.%s (CUDA %s) but the venv is CUDA %s (%s); fix: %s"
                    % (host, path, dist, found, found, ref, ref_src, fix_for(dist, found, ref)))
        if check_libs:
            missing = [n for n in needed
                       if not resolves(n, os.path.dirname(path), rpath, cache, venv_libs | {os.path.basename(path)})]
            if missing:
                problems.append(
                    "%s: %s (%s) needs %s, not found (RPATH %s, ld.so.cache, %s); fix: install the host packages "
                    "that provide them (sglang_rdma_packages / sglang_system_packages: rdma-core, libibverbs1, "
                    "ibverbs-providers, libnuma1, libcurl4; libcuda.so.1 comes with the NVIDIA driver)"
                    % (host, path, dist, ", ".join(missing), ":".join(rpath) or "none", ":".join(DEFAULT_DIRS)))
    if import_module and torch_major is not None and not problems:
        py = python or os.path.join(venv, "bin", "python")
        try:
            r = subprocess.run([py, "-c", "import torch, %s" % import_module], capture_output=True, text=True,
                               timeout=600, check=False)
            if r.returncode != 0:
                tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
                problems.append("%s: %s cannot import %s: %s; fix: install %s built for CUDA %s and the host "
                                "libraries it links" % (host, py, import_module, " | ".join(tail),
                                                         ", ".join(packages) or import_module, ref))
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append("%s: %s -c 'import %s' failed: %s" % (host, py, import_module, exc))
    return {"ok": not problems, "torch_cuda_major": torch_major, "reference_major": ref, "checked": checked,
            "problems": problems}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--venv", required=True)
    ap.add_argument("--host", default=os.uname().nodename)
    ap.add_argument("--expect-cuda-major", type=int)
    ap.add_argument("--check-libs", action="store_true")
    ap.add_argument("--package", action="append", default=[], help="distribution whose objects are all checked")
    ap.add_argument("--import", dest="import_module")
    a = ap.parse_args(argv)
    res = check(a.venv, a.host, a.expect_cuda_major, a.check_libs, a.package, a.import_module)
    print(json.dumps(res))
    return 0 if res["ok"] else 2


if __name__ == "__main__":
    sys.exit(main())
