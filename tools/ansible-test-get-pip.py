#!/usr/bin/env python3
"""Offline stand-in for ansible-test's pip bootstrap script (downloaded by ansible-test from its own site as
get-pip-<ver>.py), which this network cannot reach. `make sanity` copies it to ~/.ansible/test/cache/get_pip_<ver>.py
when no real one is cached. Like get-pip.py it takes pip-install arguments (e.g. `pip==24.2 --no-setuptools`):
it bootstraps the bundled pip with ensurepip, then installs the requested packages from the configured index."""
import subprocess
import sys

args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], stdout=subprocess.DEVNULL)
if args:
    subprocess.check_call([sys.executable, "-m", "pip", "install"] + args)
