"""Short-lived TCP listener for the SGLang reachability preflight (roles/sglang/tasks/reachability.yml).

usage: python3 -c "$(cat sglang_port_listen.py)" SECONDS READY_FILE PORT [PORT ...]
       python3 -c "$(cat sglang_port_listen.py)" --await SECONDS READY_FILE
       python3 -c "$(cat sglang_port_listen.py)" --stop READY_FILE PID
Binds each PORT on all addresses ONLY when it is free and accepts connections (closing each at once) until it is
told to stop (SIGTERM, the --stop form) or SECONDS have passed, then exits: nothing is left behind. It counts no
connections: anything may connect meanwhile - a running router health-checks a stopped worker's port
every few seconds from the very host whose connect is being proven, and a listener that counted that check as the
expected connection and left would make the real connect fail ("no connection within 8 s").
Once every port is bound (or found in use) it creates READY_FILE (exclusively, mode 0600, never through a link) with
its PID in it. The role runs the listener as an async job, whose start can lag its task by seconds on a loaded host
(a connect that came first would be judged a blocked path), so before any host connects it runs the --await form on
the same host: it waits up to SECONDS for READY_FILE, prints the PID, removes the file and exits 0, or exits 1 naming
the file it did not see. After the connects, --stop sends SIGTERM to that PID when it is still this listener (its
command line names READY_FILE). A port already in use (the running SGLang service on a second run) is left alone: a
connect to it proves the path as well.
Prints one JSON line: {"listening": [ports], "in_use": [ports], "accepted": {port: [peer addresses]}}.
"""
import errno
import json
import os
import select
import signal
import socket
import sys
import time

if sys.argv[1] == "--await":
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline:
        try:
            with open(sys.argv[3]) as fh:
                pid = fh.read().strip()
            if pid:
                os.unlink(sys.argv[3])
                print(pid)
                sys.exit(0)
        except FileNotFoundError:
            pass
        time.sleep(0.2)
    sys.exit("the reachability listener did not bind its ports within %s s (no %s)" % (sys.argv[2], sys.argv[3]))
if sys.argv[1] == "--stop":
    try:
        with open("/proc/%d/cmdline" % int(sys.argv[3]), "rb") as fh:
            mine = sys.argv[2].encode() in fh.read().split(b"\0")
    except (OSError, ValueError):
        mine = False            # gone already (nothing was free to bind, or its time is up)
    if mine:
        os.kill(int(sys.argv[3]), signal.SIGTERM)
    sys.exit(0)

deadline = time.monotonic() + float(sys.argv[1])
ready_file = sys.argv[2]
socks, in_use, accepted = {}, [], {}
for port in map(int, sys.argv[3:]):
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
    accepted[port] = []
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
fd = os.open(ready_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
os.write(fd, b"%d\n" % os.getpid())
os.close(fd)
while socks and not stop and time.monotonic() < deadline:
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
print(json.dumps({"listening": sorted(accepted), "in_use": sorted(in_use), "accepted": accepted}))
