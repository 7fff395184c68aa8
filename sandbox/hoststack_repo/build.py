#!/usr/bin/env python3
"""Build the sandbox's apt repository of STAND-IN host-stack packages (issue 36).

    python3 sandbox/hoststack_repo/build.py OUT [--kernel RELEASE] [--stack NAME] [--variant main|newer|proprietary]

Every package of the declared stack (roles/host_stack/vars/stacks.yml) with its real name (``{kernel}`` filled with
RELEASE, default this machine's) and its declared upstream version, built with ``dpkg-deb --build`` and indexed in a
flat repository (``OUT/Packages``, apt's ``deb [trusted=yes] file:OUT ./`` format, written here from the control fields,
size and sha256: the fields dpkg-scanpackages writes). The Debian revision ``-0b300standin1`` is this project's, not
Ubuntu's. Inside each package there is only /usr/share/doc/<name>/STAND-IN: no driver, no module.
Variants for the traps: ``newer`` - the driver group at 580.178.04 (the CUDA repository's nvidia-open-580 build of the
B300 field report, host-stack-facts.md), a second source; ``proprietary`` - the proprietary flavour's
nvidia-driver-580-server and nvidia-dkms-580 at the declared version.
NOT wired into sandbox/fleet.sh yet: README "Host stack" says what the sandbox does not show.
"""
import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REVISION = "-0b300standin1"
NEWER = "580.178.04"


def packages(stack, kernel, variant):
    out = []
    for p in stack["packages"]:
        name = p["name"].replace("{kernel}", kernel)
        version = p["version"] or "1.0"
        if variant == "newer":
            if p["group"] != "driver":
                continue
            version = NEWER
        out.append((name, version if "-" in version else version + REVISION))
    if variant == "proprietary":
        v = stack["driver"]["version"] + REVISION
        out = [("nvidia-driver-%s-server" % stack["driver"]["branch"], v), ("nvidia-dkms-%s" % stack["driver"]["branch"], v)]
    return out


def build_deb(tmp, out, name, version):
    d = os.path.join(tmp, "%s_%s" % (name, version))
    os.makedirs(os.path.join(d, "DEBIAN"))
    doc = os.path.join(d, "usr", "share", "doc", name)
    os.makedirs(doc)
    with open(os.path.join(doc, "STAND-IN"), "w") as fh:
        fh.write("b300-rollout sandbox stand-in for %s %s: no driver, no kernel module inside.\n" % (name, version))
    with open(os.path.join(d, "DEBIAN", "control"), "w") as fh:
        fh.write("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: b300-rollout sandbox <sandbox@invalid>\n"
                 "Section: misc\nPriority: optional\nDescription: STAND-IN for %s (b300-rollout sandbox)\n"
                 " Carries the real package name and version only; see sandbox/hoststack_repo/build.py.\n"
                 % (name, version, name))
    deb = os.path.join(out, "%s_%s_all.deb" % (name, version))
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "--build", d, deb], check=True, capture_output=True)
    return deb


def stanza(deb, out):
    control = subprocess.run(["dpkg-deb", "-f", deb], check=True, capture_output=True, text=True).stdout.rstrip("\n")
    data = open(deb, "rb").read()
    return "%s\nFilename: ./%s\nSize: %d\nSHA256: %s\n" % (
        control, os.path.relpath(deb, out), len(data), hashlib.sha256(data).hexdigest())


def build(out, kernel=None, stack_name="b300-noble-580.173", variant="main"):
    stacks = yaml.safe_load(open(os.path.join(ROOT, "roles", "host_stack", "vars", "stacks.yml")))["host_stack_stacks"]
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="hoststack-repo-")
    try:
        debs = [build_deb(tmp, out, n, v) for n, v in packages(stacks[stack_name], kernel or platform.release(), variant)]
    finally:
        shutil.rmtree(tmp)
    with open(os.path.join(out, "Packages"), "w") as fh:
        fh.write("\n".join(stanza(d, out) for d in debs))
    return debs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--kernel", default=None)
    ap.add_argument("--stack", default="b300-noble-580.173")
    ap.add_argument("--variant", choices=("main", "newer", "proprietary"), default="main")
    a = ap.parse_args()
    for d in build(a.out, a.kernel, a.stack, a.variant):
        print(d)


if __name__ == "__main__":
    main()
