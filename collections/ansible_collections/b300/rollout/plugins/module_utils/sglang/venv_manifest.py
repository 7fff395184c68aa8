# -*- coding: utf-8 -*-
"""The distributions a venv has installed, and whether a no-op `pip install` of the pins can be skipped (issue 40).

A no-change re-run used to start pip in every venv (1-3 s each) to learn that the pinned versions were already
installed. After a good install, roles/sglang records the venv's distributions (name -> version, read from the
`*.dist-info/METADATA` files of its site-packages, what importlib.metadata reads) together with the pins it
installed; the next run reads the distributions again and skips pip only when all of these hold:
  - the record exists and was written for the same pins (and the same names that must be absent);
  - every pin is installed at its version (a pin without `==` only by name);
  - no name that must be absent is installed;
  - the installed distributions are exactly the recorded ones (nothing was added, removed or changed since).
Anything else (a missing or unreadable record, another pin, a changed venv) runs pip as before.

Plain functions; unit tests in tests/unit/test_sglang_venv_manifest.py.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type

import glob
import json
import os
import re

RECORD_NAME = ".b300-venv-manifest.json"
RECORD_VERSION = 1


def canonical(name):
    """PEP 503 normalised distribution name (Mooncake_Transfer.Engine -> mooncake-transfer-engine)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_metadata(text):
    """(name, version) from a METADATA/PKG-INFO text (email headers, up to the first blank line); None when a
    header is missing."""
    name = version = None
    for line in text.splitlines():
        if not line.strip():
            break
        if line.startswith("Name:") and name is None:
            name = line[5:].strip()
        elif line.startswith("Version:") and version is None:
            version = line[8:].strip()
    if not name or not version:
        return None
    return name, version


def installed(venv):
    """{canonical name: version} of the distributions in venv's site-packages (lib*/python*/site-packages)."""
    found = {}
    for meta in sorted(glob.glob(os.path.join(venv, "lib*", "python*", "site-packages", "*.dist-info", "METADATA"))):
        try:
            with open(meta, encoding="utf-8", errors="replace") as fh:
                parsed = parse_metadata(fh.read(8192))
        except OSError:
            continue
        if parsed:
            found[canonical(parsed[0])] = parsed[1]
    return found


def parse_pin(pin):
    """'sglang==0.5.18' -> ('sglang', '0.5.18'); 'mooncake-transfer-engine' -> (name, None). Other specifiers
    (>=, ~=, extras, URLs) cannot be checked against one record: ValueError."""
    m = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*))?\s*$", pin)
    if not m:
        raise ValueError("pin %r is not NAME or NAME==VERSION" % (pin,))
    return canonical(m.group(1)), m.group(2)


def record_key(pins, absent):
    """What a record is valid for: the pins and the names that must be absent, order-free."""
    return {"pins": sorted(pins), "absent": sorted(canonical(a) for a in absent)}


def read_record(venv):
    """The record in venv, or None when it is absent or unreadable."""
    try:
        with open(os.path.join(venv, RECORD_NAME), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != RECORD_VERSION:
        return None
    return data


def mismatches(pins, absent, now, record):
    """Why pip must run: a list of short reasons ([] when the no-op pip can be skipped).
    now: installed(); record: read_record() (None when absent)."""
    reasons = []
    for pin in pins:
        name, version = parse_pin(pin)
        if name not in now:
            reasons.append("%s is not installed" % name)
        elif version is not None and now[name] != version:
            reasons.append("%s %s is installed (pinned %s)" % (name, now[name], version))
    for name in sorted(canonical(a) for a in absent):
        if name in now:
            reasons.append("%s %s is installed (must be absent)" % (name, now[name]))
    if record is None:
        reasons.append("no record of a good install")
        return reasons
    if record.get("key") != record_key(pins, absent):
        reasons.append("the record is for other pins (%s)" % ", ".join((record.get("key") or {}).get("pins") or []))
    was = record.get("installed") or {}
    changed = sorted(n for n in set(was) | set(now) if was.get(n) != now.get(n))
    if changed:
        shown = ["%s %s -> %s" % (n, was.get(n, "absent"), now.get(n, "absent")) for n in changed[:5]]
        reasons.append("the venv changed since the record: %s%s"
                       % (", ".join(shown), " and %d more" % (len(changed) - 5) if len(changed) > 5 else ""))
    return reasons


def write_record(venv, pins, absent, now):
    """Write the record (atomically: a temporary file renamed over it)."""
    path = os.path.join(venv, RECORD_NAME)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"version": RECORD_VERSION, "key": record_key(pins, absent), "installed": now}, fh,
                  indent=1, sort_keys=True)
        fh.write("\n")
    os.replace(tmp, path)
    return path
