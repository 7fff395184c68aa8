"""The SGLang API key is a secret end to end (issue 7), on the sandbox (stub workers, REAL sglang-router 0.3.2).

The key is a literal in an extra-vars file ENCRYPTED with ansible-vault (password file in a tmp dir, never in the
repository). kimi_k3 is deployed with it, then:
  - the key string never appears in ansible-playbook output, neither plain nor with -v (nor base64/urlencoded);
  - every env file holding it is mode 0640 root:sglang (workers and router);
  - through the router: no key -> 401, wrong key -> 401, right key -> 200 (and /readiness stays open);
  - workers and router run as user `sglang` (unit User= and the process owner), not root;
  - the router bind address: default 0.0.0.0 documented in roles/sglang/defaults + argument_specs, the
    running router listens there, and the planner puts sglang_router_bind_host into --host (configurable).
The key is added and removed with the default rolling strategy (router first then each worker re-added with the
key; workers first then the router), a different key on the keyed fleet is refused before any change (no order keeps
serving through a rotation). Afterwards kimi_k3 is deployed again WITHOUT a key (the state the other sandbox tests
expect), also checked.
`playbooks/firmware_audit.yml --check` changing nothing (changed=0, no file changed on the hosts) is already proven by
tests/integration/test_firmware_audit.py::test_audit_in_check_mode_changes_nothing; not duplicated here.
The key is in no /proc/<pid>/cmdline (read as root and as nobody) and not in the journal (the stub logs server_args
with api_key at INFO like SGLang 0.5.17; roles/sglang/files/sglang_launch.py redacts it).
"""
import base64
import json
import pathlib
import re
import shlex
import secrets
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
SANDBOX_VARS = ROOT / "tests" / "integration" / "sglang_sandbox_vars.yml"
ROUTER = "http://10.89.30.11:30080"
UNITS = {"b300a": ["sglang-kimi_k3-w0.service", "sglang-router.service"], "b300b": ["sglang-kimi_k3-w0.service"]}
ENV_FILES = {"b300a": ["/etc/sglang/kimi_k3-w0.env", "/etc/sglang/router.env"], "b300b": ["/etc/sglang/kimi_k3-w0.env"]}

pytestmark = [pytest.mark.integration, pytest.mark.sandbox]


def deploy(sandbox, *extra, verbose=False):
    argv = ["ansible-playbook", "-i", sandbox.inventory, "playbooks/sglang_deploy.yml", "-l", "b300a,b300b",
            "-e", "sglang_profile=kimi_k3", "-e", "@%s" % SANDBOX_VARS] + list(extra) + (["-v"] if verbose else [])
    r = sandbox.run(argv, check=False, timeout=1500)
    return r.returncode, r.stdout + r.stderr


def chat(key=None):
    body = json.dumps({"model": "Kimi-K3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer %s" % key
    req = urllib.request.Request(ROUTER + "/v1/chat/completions", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


@pytest.fixture(scope="module")
def keyed(sandbox, tmp_path_factory):
    """kimi_k3 deployed with a vaulted key; yields (key, outputs); redeploys without a key afterwards."""
    tmp = tmp_path_factory.mktemp("vault")
    key = "sk-b300-" + secrets.token_hex(16)
    pw = tmp / "vault-pass"
    pw.write_text(secrets.token_hex(24) + "\n")
    pw.chmod(0o600)
    vars_file = tmp / "secret.yml"
    vars_file.write_text(yaml.safe_dump({"sglang_api_key": key}))
    sandbox.run(["ansible-vault", "encrypt", "--vault-password-file", str(pw), str(vars_file)])
    assert vars_file.read_text().startswith("$ANSIBLE_VAULT;"), "the vars file is not vault-encrypted"
    assert key not in vars_file.read_text()
    # the default rolling strategy adds the key to a serving fleet: router first, then each worker re-added WITH the
    # key (POST /workers api_key; without it the router's /model_info health checks got 401 and the fleet went "not
    # ready" a few checks later). The second, plain run below waits for the router's readiness again: it catches that.
    extra = ["-e", "@%s" % vars_file, "--vault-password-file", str(pw)]
    outputs = {}
    try:
        rc, outputs["deploy -v"] = deploy(sandbox, *extra, verbose=True)
        assert rc == 0, outputs["deploy -v"][-5000:]
        rc, outputs["deploy (2nd, plain)"] = deploy(sandbox, *extra)
        assert rc == 0, outputs["deploy (2nd, plain)"][-5000:]
        yield key, outputs
    finally:
        # removal with the default rolling strategy: workers drop the key one at a time, then the router
        rc, out = deploy(sandbox)
        assert rc == 0, "redeploy without the key failed:\n" + out[-5000:]
        assert "API key on the serving fleet: remove (strategy rolling)" in out, out[-4000:]
        assert key not in out, "the old API key appears in the output of the run that removed it"
        assert chat()[0] == 200, "the router still wants a key after the redeploy without one"


def test_key_never_in_playbook_output(keyed):
    key, outputs = keyed
    forms = {key, base64.b64encode(key.encode()).decode(), urllib.parse.quote(key), key[8:]}
    for name, out in outputs.items():
        leaked = [f for f in forms if f in out]
        assert not leaked, "%s: the API key appears in ansible-playbook output" % name
        assert "PLAY RECAP" in out, name   # the output is the real thing, not an empty capture


def test_env_files_hold_key_and_are_0640_root_sglang(sandbox, keyed):
    key, _ = keyed
    for host, files in ENV_FILES.items():
        for f in files:
            st = sandbox.exec(host, "stat -c '%%a %%U %%G' %s" % f).stdout.split()
            assert st == ["640", "root", "sglang"], (host, f, st)
            # the key is really there (so the mode check is about a file that matters), quoted for systemd
            assert sandbox.exec(host, "grep -c '^SGLANG_API_KEY=\"%s\"$' %s" % (key, f)).stdout.strip() == "1", (host, f)
            # and not readable by other users
            r = sandbox.exec(host, "su -s /bin/sh nobody -c 'cat %s' >/dev/null 2>&1; echo $?" % f)
            assert r.stdout.strip() != "0", (host, f, "readable by nobody")


def test_key_added_by_rolling_restart_keeps_every_worker_healthy(keyed):
    """The key was added with the rolling strategy: router first, workers one at a time; every worker stays healthy
    in the router past its health-check failure window (5 s x 2 with the resilient flags)."""
    key, outputs = keyed
    assert "API key on the serving fleet: add (strategy rolling)" in outputs["deploy -v"], outputs["deploy -v"][-4000:]
    assert "API key on the serving fleet: none (strategy rolling)" in outputs["deploy (2nd, plain)"]
    time.sleep(12)
    req = urllib.request.Request(ROUTER + "/workers", headers={"Authorization": "Bearer %s" % key})
    with urllib.request.urlopen(req, timeout=10) as resp:
        workers = json.loads(resp.read())["workers"]
    assert len(workers) == 2 and all(w["is_healthy"] for w in workers), workers


def test_key_rotation_refused_under_rolling(sandbox, keyed):
    """A different key on a keyed serving fleet: no order keeps serving, so the rolling strategy refuses before any
    change, saying why and how (parallel in a window, or remove then add)."""
    key, _ = keyed
    other = "sk-b300-" + secrets.token_hex(16)
    before = {h: sandbox.exec(h, "stat -c '%%Y %%s' %s" % " ".join(fs)).stdout for h, fs in ENV_FILES.items()}
    rc, out = deploy(sandbox, "-e", "sglang_api_key=%s" % other)
    assert rc != 0, out[-3000:]
    assert "no restart order keeps serving through a rotation. Nothing was changed." in re.sub(r"\s+", " ", out), \
        out[-3000:]
    assert "sglang_restart_strategy=parallel" in out
    assert other not in out and key not in out, "a key appears in the refused run's output"
    after = {h: sandbox.exec(h, "stat -c '%%Y %%s' %s" % " ".join(fs)).stdout for h, fs in ENV_FILES.items()}
    assert after == before
    assert chat(key)[0] == 200


def test_router_requires_the_key(keyed):
    key, _ = keyed
    assert chat()[0] == 401
    assert chat("not-" + key)[0] == 401
    status, body = chat(key)
    assert status == 200, body
    assert json.loads(body)["choices"][0]["message"]["content"], body
    with urllib.request.urlopen(ROUTER + "/readiness", timeout=10) as resp:   # probes stay open
        assert resp.status == 200


def test_services_run_as_sglang_not_root(sandbox, keyed):
    for host, units in UNITS.items():
        for unit in units:
            props = dict(line.split("=", 1) for line in sandbox.exec(
                host, "systemctl show -p User,MainPID,ActiveState %s" % unit).stdout.splitlines() if "=" in line)
            assert props["ActiveState"] == "active", (host, unit, props)
            assert props["User"] == "sglang", (host, unit, props)
            owner = sandbox.exec(host, "ps -o user= -p %s" % props["MainPID"]).stdout.strip()
            assert owner == "sglang", (host, unit, owner)
            # the main process and its children (the container's cgroup tree is not readable from inside)
            users = set(sandbox.exec(host, "for p in %s $(pgrep -P %s); do ps -o user= -p $p; done"
                                     % (props["MainPID"], props["MainPID"])).stdout.split())
            assert users == {"sglang"}, (host, unit, users)


def test_router_bind_address_default_documented_and_configurable(sandbox, keyed):
    defaults = (ROOT / "roles" / "sglang" / "defaults" / "main.yml").read_text()
    m = re.search(r"((?:^#.*\n)+)sglang_router_bind_host: (\S+)", defaults, re.M)
    assert m and m.group(2) == "0.0.0.0" and "bind" in m.group(1).lower(), "default not documented"
    specs = yaml.safe_load((ROOT / "roles" / "sglang" / "meta" / "argument_specs.yml").read_text())
    opt = specs["argument_specs"]["main"]["options"]["sglang_router_bind_host"]
    assert opt.get("default") == "0.0.0.0" and opt.get("description"), opt
    # running router: listens on the documented default
    listening = sandbox.exec("b300a", "ss -ltnH 'sport = :30080'").stdout
    assert re.search(r"0\.0\.0\.0:30080\s", listening), listening
    # configurable: the planner (what the role renders into ExecStart) takes sglang_router_bind_host for --host
    from ansible_collections.b300.rollout.plugins.module_utils.sglang_plan import build_plan
    profile = yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "profiles" / "kimi_k3.yml").read_text())
    catalogs = {"server": {}, "router": {}}
    hosts = [{"name": "b300a", "address": "10.89.30.11", "groups": ["gpu_nodes", "sglang_router"]},
             {"name": "b300b", "address": "10.89.30.12", "groups": ["gpu_nodes"]}]
    plan = build_plan(profile, hosts, {"router_bind_host": "10.89.30.11", "model_root": "/models",
                                       "known_combinations": [{"sglang": "0.5.18", "router": "0.3.2"}]}, catalogs)
    args = plan["router"]["args"]
    assert args[args.index("--host") + 1] == "10.89.30.11", args


CMDLINES = ("for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done")


def test_key_not_in_process_arguments(sandbox, keyed):
    """No process's argv holds the key (roles/sglang/files/sglang_launch.py), read as root and as user nobody."""
    key, _ = keyed
    for host in UNITS:
        for who, cmd in (("root", CMDLINES), ("nobody", "runuser -u nobody -- sh -c %s" % shlex.quote(CMDLINES))):
            out = sandbox.exec(host, cmd).stdout
            assert "sglang" in out, "%s: no sglang process found in /proc/*/cmdline as %s: %s" % (host, who, out[-2000:])
            assert key not in out, ("%s: the API key is in /proc/<pid>/cmdline (read as %s); expected the units to "
                                    "start through sglang_launch.py with the token $${SGLANG_API_KEY}" % (host, who))
        assert "sglang_launch.py" in sandbox.exec(host, "ps -eo args").stdout, "%s: no unit runs the launcher" % host


def test_key_not_in_journal(sandbox, keyed):
    """The stub prints server_args with api_key at INFO like SGLang 0.5.17; the launcher redacts it in the journal."""
    key, _ = keyed
    for host, units in UNITS.items():
        unit_args = " ".join("-u %s" % u for u in units)
        root_log = sandbox.exec(host, "journalctl --no-pager -o cat %s" % unit_args, timeout=120).stdout
        assert root_log.strip(), "%s: journal of %s is empty (as root)" % (host, units)
        for unit in units:   # SyslogIdentifier= in the units: `journalctl -t <unit name>` finds the service's lines
            ident = unit[:-len(".service")]
            tagged = sandbox.exec(host, "journalctl --no-pager -o cat -t %s" % ident, timeout=120).stdout
            assert tagged.strip() and key not in tagged, "%s: no journal lines tagged %s (or the key is there)" % (
                host, ident)
        assert key not in sandbox.exec(host, "journalctl --no-pager -o cat", timeout=120).stdout, (
            "%s: the API key is in the journal (read as root); expected `<redacted>` (sglang_launch.py filter)" % host)
        user_log = sandbox.exec(host, "runuser -u nobody -- journalctl --no-pager -o cat 2>&1", check=False).stdout
        assert key not in user_log, "%s: the API key is in the journal (read as nobody)" % host
        if "w0" in " ".join(units):
            assert "api_key='<redacted>'" in root_log, (
                "%s: the stub's server_args line with api_key='<redacted>' was not found in the journal of %s; the "
                "redaction is then not tested" % (host, units))
