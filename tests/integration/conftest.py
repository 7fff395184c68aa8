"""Integration-test fixtures: the sandbox fleet (systemd-in-Podman hosts b300a/b300b reachable over SSH).

`sandbox` (session scope) runs `sandbox/fleet.sh up 2`: it builds the image when missing, starts the hosts when they
are not running; new hosts get the inventory's scenario (`sandbox_scenario`, healthy), running hosts keep theirs.
A running fleet is reused (about 2 s) and left running afterwards, for the next run and for humans
(`sandbox/fleet.sh down` removes it).

Nothing is skipped silently: without podman (or when the fleet cannot start) every test that needs the sandbox
FAILS with the reason. Tests marked `@pytest.mark.sandbox` get the fixture without naming it. Skips of integration
tests are listed in the terminal summary; with B300_STRICT_SKIPS=1 they count as failures.
"""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FLEET = ROOT / "sandbox" / "fleet.sh"
VENV_BIN = ROOT / ".venv" / "bin"
HOSTS = {"b300a": "10.89.30.11", "b300b": "10.89.30.12"}


def _env():
    env = dict(os.environ)
    env.update(
        ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"),
        CONTAINERS_CONF=os.environ.get("CONTAINERS_CONF", str(ROOT / "sandbox" / "containers.conf")),
        PATH="%s:%s" % (VENV_BIN, os.environ.get("PATH", "")),
        ANSIBLE_FORCE_COLOR="0",
        NO_COLOR="1",
        # tests switch scenarios under the hosts' feet: never answer from the fact cache
        ANSIBLE_CACHE_PLUGIN="memory",
    )
    return env


def failed_tasks(output, limit=6):
    """The failed tasks of an ansible-playbook output (their TASK line and the failure, each cut to 800 characters),
    as a block for the END of an assertion message: the tail of a long output is what CI's summary keeps, and the
    recap alone does not say what failed (CI of 2026-12-06: two deploys failed on b300a with only their recap shown)."""
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.rstrip("* ")
        elif line.startswith(("fatal: [", "failed: [", "ERROR!")):
            found.append("%s\n  %s" % (task, line[:800]))
    return ("\n=== failed tasks (%d):\n%s" % (len(found), "\n".join(found[-limit:]))) if found else ""


class Sandbox:
    """Handle on the running 2-host sandbox."""

    def __init__(self):
        self.root = ROOT
        self.inventory = str(ROOT / "inventory" / "sandbox")
        self.hosts = dict(HOSTS)  # inventory name -> address
        self.key = str(ROOT / ".cache" / "sandbox" / "id_ed25519")
        self.env = _env()

    @staticmethod
    def container(host):
        return "b300-%s" % host

    def run(self, argv, check=True, timeout=600, **kw):
        """Run argv in the repository root with the sandbox environment; text output captured."""
        r = subprocess.run(argv, cwd=ROOT, env=kw.pop("env", self.env), capture_output=True, text=True,
                           timeout=timeout, **kw)
        if check and r.returncode != 0:
            raise AssertionError("%s failed (rc %d):\n%s\n%s%s" % (" ".join(map(str, argv)), r.returncode,
                                                                   r.stdout[-4000:], r.stderr[-4000:],
                                                                   failed_tasks(r.stdout)))
        return r

    def ansible_playbook(self, playbook, *args, limit=None, check=True, timeout=600):
        """ansible-playbook PLAYBOOK -i inventory/sandbox [-l LIMIT] ARGS... (over SSH, like production)."""
        argv = ["ansible-playbook", str(playbook), "-i", self.inventory]
        if limit:
            argv += ["-l", limit]
        return self.run(argv + list(args), check=check, timeout=timeout)

    def ansible(self, pattern, module, module_args=None, *args, check=True, timeout=300):
        """Ad-hoc `ansible PATTERN -m MODULE [-a ARGS]` against the sandbox inventory."""
        argv = ["ansible", pattern, "-i", self.inventory, "-m", module]
        if module_args is not None:
            argv += ["-a", module_args]
        return self.run(argv + list(args), check=check, timeout=timeout)

    def ansible_json(self, pattern, module, module_args=None, *args, timeout=300):
        """Ad-hoc run with the json callback: {host: module result}; fails when any host failed/unreachable. The
        callback lists a task once for every host when the strategy is not the builtin linear one (its notes: "host
        results will be added to new task results"; ansible.cfg's b300.rollout.mitogen_linear is such a strategy), so
        the hosts of every entry of the play are merged."""
        env = dict(self.env, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
        argv = ["ansible", pattern, "-i", self.inventory, "-m", module]
        if module_args is not None:
            argv += ["-a", module_args]
        r = self.run(argv + list(args), check=False, timeout=timeout, env=env)
        try:
            tasks = json.loads(r.stdout)["plays"][0]["tasks"]
            if not tasks:
                raise IndexError("no task")
            results = {h: res for t in tasks for h, res in t["hosts"].items()}
        except (ValueError, KeyError, IndexError) as e:
            raise AssertionError("ansible %s -m %s: no JSON result (%s):\n%s\n%s" % (
                pattern, module, e, r.stdout[-4000:], r.stderr[-4000:])) from e
        bad = {h: v for h, v in results.items() if v.get("failed") or v.get("unreachable")}
        assert r.returncode == 0 and not bad, "ansible %s -m %s failed: %s" % (pattern, module, bad or r.stderr)
        return results

    def exec(self, host, cmd, check=True, timeout=60):
        """Run cmd in the host through `podman exec` (cmd: a shell string or an argv list)."""
        argv = ["podman", "exec", self.container(host)]
        argv += ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        return self.run(argv, check=check, timeout=timeout)

    def ssh(self, host, cmd, check=True, timeout=60):
        """Run cmd in the host over SSH as root with the sandbox key."""
        argv = ["ssh", "-i", self.key, "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                "root@%s" % self.hosts[host], cmd]
        return self.run(argv, check=check, timeout=timeout)

    def scenario(self, host, name):
        """Switch host's emulated hardware to scenario name (checked); what `sandbox/fleet.sh scenario` runs."""
        self.exec(host, "/opt/hwemu/bin/hwemu-scenario %s >/dev/null" % name)
        now = self.current_scenario(host)
        assert now == name, "%s: scenario is %r after switching to %r" % (host, now, name)

    def current_scenario(self, host):
        return self.exec(host, "cat /opt/hwemu/scenario").stdout.strip()

    def scenarios_back_to_healthy(self, request, hosts=("b300a", "b300b")):
        """Finalizer of a test module/fixture that switches scenarios: the shared fleet is left healthy."""
        request.addfinalizer(lambda: [self.scenario(h, "healthy") for h in hosts])


def pytest_configure(config):
    config.addinivalue_line("markers", "sandbox: the test needs the sandbox fleet (gets the `sandbox` fixture)")
    config.addinivalue_line("markers", "integration: runs against the sandbox fleet or real processes on loopback")
    config.addinivalue_line("markers", "controller: needs no sandbox fleet (controller-side runs, loopback processes): "
                            "make integration-controller runs these beside the fleet tests (make integration-fleet)")


# The fleet tests in the order that switches the fleet's profile once (issue 32: a suite that answers in 40 minutes).
# Alphabetical order switched kimi_k3 <-> glm52_pd five times (acceptance, boot, reboot, reliability, deploy), each
# a stop of one profile and a first converge of the other. Modules that deploy nothing (or only refuse before any
# change) first, then every kimi_k3 test, then every glm52_pd test. A module's tests stay in their order; the two
# parametrized modules (and test_acceptance, one test per profile) are split by profile, which their fixtures allow
# (no module fixture holds a deployed state). Modules not named here run first, in file order.
FLEET_ORDER = [
    ("test_sandbox.py", None), ("test_bad_input.py", None), ("test_firmware_audit.py", None), ("test_ee.py", None),
    ("test_nccl_role.py", None), ("test_health_history.py", None), ("test_thermal_soak.py", None),
    ("test_triage.py", None), ("test_weights.py", None),
    # kimi_k3
    # (test_sglang_deploy first: site.yml's first converge of the fleet, keyless; test_secrets then ADDS a key)
    ("test_boot_services.py", None), ("test_sglang_deploy.py", "kimi_k3"), ("test_host_lock_fleet.py", None),
    ("test_plan.py", None),
    ("test_reliability.py", None), ("test_rollback.py", None), ("test_secrets.py", None),
    ("test_nic_firmware_update.py", None),
    # (after the firmware update: reuses its kimi_k3 fleet to reboot a SERVING host for the host stack, issue 36)
    ("test_host_stack_fleet.py", None),
    ("test_reboot.py", "kimi_k3"), ("test_acceptance.py", "kimi_k3"),
    # glm52_pd
    ("test_acceptance.py", "glm52_pd"), ("test_reboot.py", "glm52_pd"), ("test_reboot.py", "fabric"),
    ("test_sglang_deploy.py", "glm52_pd"), ("test_reachability.py", None), ("test_wrong_cuda_variant.py", None),
]


def fleet_rank(item):
    """Where item runs in FLEET_ORDER: its module's entry, or the entry of the profile its id or name carries."""
    module = item.path.name
    for rank, (name, key) in enumerate(FLEET_ORDER):
        if name == module and (key is None or key in item.name):
            return rank
    return -1


def pytest_collection_modifyitems(config, items):
    items.sort(key=fleet_rank)      # stable: file order within a rank
    for item in items:
        if item.get_closest_marker("sandbox") and "sandbox" not in item.fixturenames:
            item.fixturenames.append("sandbox")
        if item.get_closest_marker("controller") and "sandbox" in item.fixturenames:
            raise pytest.UsageError("%s is marked controller (runs beside the fleet tests) but uses the sandbox fleet"
                                    % item.nodeid)


@pytest.fixture(scope="session")
def sandbox():
    if shutil.which("podman") is None:
        pytest.fail("podman is not installed: the integration tests need the sandbox (run `make deps`); "
                    "they fail instead of skipping so a CI without podman cannot pass by testing nothing")
    if not FLEET.is_file():
        pytest.fail("%s missing" % FLEET)
    r = subprocess.run([str(FLEET), "up", "2"], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail("sandbox/fleet.sh up 2 failed (rc %d):\n%s\n%s" % (r.returncode, r.stdout[-4000:],
                                                                       r.stderr[-4000:]))
    return Sandbox()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.skipped and os.environ.get("B300_STRICT_SKIPS") == "1" and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = "skipped, and B300_STRICT_SKIPS=1 forbids skips: %s" % (rep.longrepr,)


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    if skipped:
        terminalreporter.section("integration tests that did NOT run")
        for rep in skipped:
            reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else rep.longrepr
            terminalreporter.write_line("SKIPPED %s: %s" % (rep.nodeid, reason))
