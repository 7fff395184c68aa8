"""Short-lived TCP listener for the SGLang reachability preflight (roles/sglang/tasks/reachability.yml).

usage: python3 -c "$(cat sglang_port_listen.py)" SECONDS PORT:EXPECTED [PORT:EXPECTED ...]
Binds each PORT on all addresses ONLY when it is free and accepts connections (closing each at once) until every
port has had EXPECTED connections or SECONDS have passed, then exits: nothing is left behind. A port already in use
(the running SGLang service on a second run) is left alone: a connect to it proves the path as well.
Prints one JSON line: {"listening": [ports], "in_use": [ports], "accepted": {port: [peer addresses]}}.
"""
import errno
import json
import select
import socket
import sys
import time

deadline = time.monotonic() + float(sys.argv[1])
want, socks, in_use, accepted = {}, {}, [], {}
for spec in sys.argv[2:]:
    port, _, expected = spec.partition(":")
    port = int(port)
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # a service stopped a moment ago leaves TIME_WAIT connections on its port: without SO_REUSEADDR the bind fails
    # with EADDRINUSE although nothing listens, and the path would be judged blocked (seen on a profile switch)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("0.0.0.0", port))
        s.listen(16)
    except OSError as exc:
        s.close()
        if exc.errno == errno.EADDRINUSE:
            in_use.append(port)
            continue
        raise
    s.setblocking(False)
    socks[s] = port
    want[port] = int(expected or 1)
    accepted[port] = []
while socks and time.monotonic() < deadline:
    if all(len(accepted[p]) >= n for p, n in want.items()):
        break
    ready, _, _ = select.select(list(socks), [], [], max(0.0, min(0.5, deadline - time.monotonic())))
    for s in ready:
        try:
            conn, peer = s.accept()
        except OSError:
            continue
        accepted[socks[s]].append(peer[0])
        conn.close()
for s in socks:
    s.close()
print(json.dumps({"listening": sorted(want), "in_use": sorted(in_use), "accepted": accepted}))
