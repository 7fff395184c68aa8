#!/usr/bin/env python3
"""inotify_watch.py DIR OUT: count the kernel's IN_OPEN / IN_ACCESS events on the files of DIR (and its
subdirectories) until SIGTERM, then write {"open": {name: n}, "access": {name: n}} to OUT. An IN_ACCESS is raised for
every read() of a watched file, page cache or not, and a stat() raises none: zero events on the weight files during a
no-change run is the kernel's word that no weight byte was read (the benchmark and tests/integration/test_weights.py
run it on the hosts). Stdlib only (ctypes -> libc inotify_init1/inotify_add_watch)."""
import ctypes
import ctypes.util
import json
import os
import select
import signal
import struct
import sys

IN_ACCESS, IN_OPEN = 0x1, 0x20
EVENT = struct.Struct("iIII")


def main(root, out):
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        raise OSError(ctypes.get_errno(), "inotify_init1")
    wds = {}
    for d, _dirs, _files in os.walk(root):
        wd = libc.inotify_add_watch(fd, os.fsencode(d), IN_ACCESS | IN_OPEN)
        if wd >= 0:
            wds[wd] = d
    counts = {"open": {}, "access": {}}
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    ready = os.path.join(os.path.dirname(out) or ".", os.path.basename(out) + ".ready")
    open(ready, "w").close()
    while not stop:
        r, _w, _x = select.select([fd], [], [], 0.2)
        if not r:
            continue
        try:
            buf = os.read(fd, 65536)
        except BlockingIOError:
            continue
        off = 0
        while off < len(buf):
            wd, mask, _cookie, length = EVENT.unpack_from(buf, off)
            name = buf[off + EVENT.size:off + EVENT.size + length].rstrip(b"\0").decode("utf-8", "replace")
            off += EVENT.size + length
            rel = os.path.relpath(os.path.join(wds.get(wd, "?"), name), root) if name else "."
            for bit, key in ((IN_OPEN, "open"), (IN_ACCESS, "access")):
                if mask & bit:
                    counts[key][rel] = counts[key].get(rel, 0) + 1
    with open(out, "w") as fh:
        json.dump(counts, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
