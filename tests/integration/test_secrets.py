"""The SGLang API key is a secret end to end (issue 7), on the sandbox (stub workers, REAL sglang-router 0.3.2).

The key is a literal in an extra-vars file ENCRYPTED with ansible-vault (password file in a tmp dir, never in the
repository). kimi_k3 is deployed with it, then:
  - the key string never appears in ansible-playbook output, neither plain nor with -v (nor base64/urlencoded);
  - every env file holding it is mode 0640 root:sglang (workers and router);
  - through the router: no key -> 401, wrong key -> 401, right key -> 200 (and /readiness stays open);
  - workers and router run as user `sglang` (unit User= and the process owner), not root;
  - the router bind address: default 0.0.0.0 documented in roles/sglang/defaults + argument_specs, the
    running router listens there, and the planner puts sglang_router_bind_host into --host (configurable).
The keyed deploys also carry legal values that need care (issue 23), proven END TO END: a model root with a space,
`%` and `$` (systemd quoting and %%/$$ escaping on the ExecStart= line) and an env value with spaces and `%` reach
the worker processes byte for byte (/proc/<pid>/cmdline and environ) and the stub's answers through the router.
The key is added and removed with the default rolling strategy (router first then each worker re-added with the
key; workers first then the router), a different key on the keyed fleet is refused before any change (no order keeps
serving through a rotation). Afterwards kimi_k3 is deployed again WITHOUT a key (the state the other sandbox tests
expect), also checked.
No secret in any output (issue 23): a key that cannot be a Bearer token is refused by preflight before any task
could put it in a header (ansible-core prints the error text of a module that raised even under no_log: reproduced
below with uri and a key holding a newline); the whole output (-vvv) of failing runs and the controller-side
artifacts (the ansible log, a jsonfile fact cache, artifacts/, Ansible's local temp) hold no key: bad keys refused
controller-side, a key the router rejects (its env file says another key than the process holds) and an unreachable
router (rolling_restart.yml against a port nothing listens on), the last two on the keyed sandbox fleet.
`playbooks/firmware_audit.yml --check` changing nothing (changed=0, no file changed on the hosts) is already proven by
tests/integration/test_firmware_audit.py::test_audit_in_check_mode_changes_nothing; not duplicated here.
The key is in no /proc/<pid>/cmdline (read as root and as nobody) and not in the journal (the stub logs server_args
with api_key at INFO like SGLang 0.5.17; roles/sglang/files/sglang_launch.py redacts it).
"""
import base64
import json
import os
import pathlib
import re
import shlex
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROUTER = "http://10.89.30.11:30080"
UNITS = {"b300a": ["sglang-kimi_k3-w0.service", "sglang-router.service"], "b300b": ["sglang-kimi_k3-w0.service"]}
CARE_ROOT = "/srv/model store/50%/$HOME"      # legal: every character survives, quoted and escaped in the unit
CARE_ENV = "w0 at 50% load, spaced"          # legal in an env file: inner spaces and % are plain characters
# (no model directory there: the weights check is off for this deploy, the stub loads nothing)
CARE = json.dumps({"sglang_model_root": CARE_ROOT, "sglang_model_check": False,
                   "sglang_server_extra_env": {"SGLANG_STUB_INSTANCE_NAME": CARE_ENV}})
ENV_FILES = {"b300a": ["/etc/sglang/kimi_k3-w0.env", "/etc/sglang/router.env"], "b300b": ["/etc/sglang/kimi_k3-w0.env"]}

pytestmark = [pytest.mark.integration]   # the sandbox tests get the fleet through the `keyed` fixture


def deploy(sandbox, *extra, verbose=False):
    argv = ["ansible-playbook", "-i", sandbox.inventory, "playbooks/sglang_deploy.yml", "-l", "b300a,b300b",
            "-e", "sglang_profile=kimi_k3"] + list(extra) + (["-v"] if verbose else [])
    r = sandbox.run(argv, check=False, timeout=1500)
    return r.returncode, r.stdout + r.stderr


def chat(key=None):
    # thinking off (SGLang's serving_chat reads chat_template_kwargs "thinking" for kimi_k3): the answer, which names
    # the instance, is in content instead of a think block in reasoning_content; 32 tokens hold the whole answer
    # (the stub, like a model, stops at max_tokens: 4 cut it before an instance name with spaces)
    body = json.dumps({"model": "Kimi-K3", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 32,
                       "chat_template_kwargs": {"thinking": False}}).encode()
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
    extra = ["-e", "@%s" % vars_file, "--vault-password-file", str(pw), "-e", CARE]
    outputs = {}
    # the key is ADDED to a keyless kimi_k3 fleet that serves: deploy one first where the fleet is not that (another
    # profile, nothing deployed yet, or a key left by a failed run), else the keyed run is a first deploy, not an add
    unit = sandbox.exec("b300a", "cat /etc/systemd/system/sglang-router.service 2>/dev/null; true").stdout
    keyed_now = sandbox.exec("b300a", "grep -c '^SGLANG_API_KEY=.' /etc/sglang/router.env 2>/dev/null; true").stdout
    if "for kimi_k3" not in unit or keyed_now.strip() not in ("", "0"):
        rc, out = deploy(sandbox)
        assert rc == 0, "the keyless kimi_k3 deploy before the key is added failed:\n" + out[-5000:]
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


def test_values_that_need_care_reach_the_process(sandbox, keyed):
    """The model root with a space, % and $ and the env value with spaces and % passed preflight and reached the
    worker processes unchanged (the unit's ExecStart= quotes and escapes, the env file is read as written)."""
    key, _ = keyed
    for host in UNITS:
        unit = sandbox.exec(host, "cat /etc/systemd/system/sglang-kimi_k3-w0.service").stdout
        assert '"--model-path" "/srv/model store/50%%/$$HOME/moonshotai/Kimi-K3"' in unit, unit
        pid = sandbox.exec(host, "systemctl show -p MainPID --value sglang-kimi_k3-w0.service").stdout.strip()
        argv = [a.decode() for a in base64.b64decode(sandbox.exec(
            host, "base64 -w0 /proc/%s/cmdline" % pid).stdout).split(b"\0")]
        environ = dict(e.decode().split("=", 1) for e in base64.b64decode(sandbox.exec(   # readable by its owner
            host, "runuser -u sglang -- base64 -w0 /proc/%s/environ" % pid).stdout).split(b"\0") if b"=" in e)
        assert argv[argv.index("--model-path") + 1] == CARE_ROOT + "/moonshotai/Kimi-K3", argv
        assert argv[argv.index("--speculative-draft-model-path") + 1] == CARE_ROOT + "/RadixArk/Kimi-K3-DSpark"
        assert environ.get("SGLANG_STUB_INSTANCE_NAME") == CARE_ENV, environ.get("SGLANG_STUB_INSTANCE_NAME")
    answers = {json.loads(chat(key)[1])["choices"][0]["message"]["content"] for _ in range(6)}
    assert any("on %s (sglang" % CARE_ENV in a for a in answers), answers


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


FRONT = {"unit": "sglang-router-front.service", "config": "/etc/haproxy/sglang-router-front.cfg"}
# files a local unprivileged user may read where a deploy writes configuration, state or its launcher
READABLE_PLACES = "/etc /run /var/lib /opt /usr/local/lib"


def test_front_runs_as_haproxy_and_holds_no_key(sandbox, keyed):
    """The router's front (HAProxy, issue 32) is hardened as the other units: its own user, not root; it passes the
    Authorization header through and never checks the key itself, so its config and its journal hold no key."""
    key, _ = keyed
    props = dict(line.split("=", 1) for line in sandbox.exec(
        "b300a", "systemctl show -p User,MainPID,ActiveState %s" % FRONT["unit"]).stdout.splitlines() if "=" in line)
    assert props["ActiveState"] == "active" and props["User"] == "haproxy", props
    users = set(sandbox.exec("b300a", "for p in %s $(pgrep -P %s); do ps -o user= -p $p; done"
                             % (props["MainPID"], props["MainPID"])).stdout.split())
    assert users == {"haproxy"}, ("the front's processes", users)
    config = sandbox.exec("b300a", "cat %s" % FRONT["config"]).stdout
    assert "monitor-uri /front-health" in config and key not in config, config[-1500:]
    log = sandbox.exec("b300a", "journalctl --no-pager -o cat -u %s" % FRONT["unit"], timeout=120).stdout
    assert key not in log, "the API key is in the front's journal"


def test_key_in_no_file_an_unprivileged_user_can_read(sandbox, keyed):
    """What nobody can read on either host (configs, env files, the front's config, state, the launcher) holds no
    key: the key reaches only the 0640 root:sglang env files (the pattern is fed on stdin, not in grep's argv)."""
    key, _ = keyed
    for host in UNITS:
        r = sandbox.exec(host, "printf '%%s\\n' %s | runuser -u nobody -- grep -rlsF -f - %s; true"
                         % (shlex.quote(key), READABLE_PLACES), timeout=300)
        assert r.stdout.strip() == "", "%s: the API key is in files user nobody can read: %s" % (host, r.stdout)
        mine = sandbox.exec(host, "printf '%%s\\n' %s | grep -rlsF -f - /etc/sglang; true" % shlex.quote(key)).stdout
        assert set(ENV_FILES[host]) <= set(mine.split()), (host, mine)   # as root the same search finds them


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
    from ansible_collections.b300.rollout.plugins.module_utils.sglang.sglang_plan import build_plan
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


# --- no secret in any output (issue 23) --------------------------------------------------------------------------
LEAK_PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: a router API call the way the role makes it (no_log)
      ansible.builtin.uri:
        url: http://127.0.0.1:9/workers
        headers: {Authorization: "Bearer {{ k }}"}
      no_log: true
"""


def traces(key, texts, dirs):
    """Where the key (or its distinctive core, or its base64) appears: [place, ...]."""
    core = key.strip()[8:] if len(key.strip()) > 16 else key.strip()
    forms = {f for f in (key, key.strip(), core, base64.b64encode(key.encode()).decode()) if f.strip()}
    found = [name for name, text in texts.items() if any(f in text for f in forms)]
    for d in map(pathlib.Path, dirs):
        for path in (d.rglob("*") if d.is_dir() else [d] if d.is_file() else []):
            if path.is_file() and path.stat().st_size < 50 * 1024 * 1024:
                data = path.read_bytes().decode("utf-8", "replace")
                if any(f in data for f in forms):
                    found.append(str(path))
    return found


def controller_run(argv, tmp, extra_env=None):
    """ansible-playbook on the controller with every controller-side trace redirected into tmp: the log
    (ANSIBLE_LOG_PATH), a jsonfile fact cache, Ansible's local temp; -vvv."""
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_FORCE_COLOR="0", NO_COLOR="1",
               ANSIBLE_LOG_PATH=str(tmp / "ansible.log"), ANSIBLE_CACHE_PLUGIN="jsonfile",
               ANSIBLE_CACHE_PLUGIN_CONNECTION=str(tmp / "facts"), ANSIBLE_LOCAL_TEMP=str(tmp / "local-tmp"),
               PATH="%s:%s" % (ROOT / ".venv" / "bin", os.environ.get("PATH", "")), **(extra_env or {}))
    r = subprocess.run(argv + ["-vvv"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    return r.returncode, r.stdout + r.stderr


def test_a_raising_module_prints_its_header_despite_no_log_so_keys_are_checked_before_use(tmp_path):
    """The hazard of issue 23, reproduced: uri with a key holding a newline raises, and ansible-core prints the
    error text, key included, although the task has no_log. Keys are therefore refused by preflight (next test)."""
    key = "sk-b300-" + secrets.token_hex(8) + "\n" + secrets.token_hex(8)
    play = tmp_path / "leak.yml"
    play.write_text(LEAK_PLAY)
    rc, out = controller_run(["ansible-playbook", "-i", "localhost,", "-c", "local", str(play), "-e",
                              json.dumps({"k": key, "ansible_python_interpreter": sys.executable})], tmp_path)
    assert rc != 0
    assert key.split("\n")[1] in out, ("ansible-core no longer prints a raising module's error text under no_log; "
                                        "the preflight check stays, update this note:\n" + out[-2000:])


@pytest.mark.controller
@pytest.mark.parametrize("key", ["sk-b300-" + "7e" * 12 + "\n", "sk-b300 " + "a1" * 16, "schl\u00fcssel-" + "c3" * 12,
                                 "\t" + "9f" * 16, "sk-b300-" + "4d" * 12 + "\r\n"],
                         ids=["newline", "space", "non_ascii", "tab", "crlf"])
def test_bad_key_refused_and_in_no_output_or_artifact(key, tmp_path):
    """site.yml --tags preflight (controller side, as the bad-input table runs it) with -vvv: refused by the value
    rules, and the key is in no output, log, fact cache, artifact or temp file."""
    import test_bad_input as tbi  # the sibling test module (pytest put its directory on sys.path to import this one)
    varsfile = tmp_path / "key.yml"
    varsfile.write_text(json.dumps({"sglang_api_key": key, "sglang_profile": "kimi_k3"}))
    hw = {"hw_module_defaults": {"bin_path": [str(tbi.HWEMU / "bin")], "sysfs_root": str(tmp_path / "sys")},
          "ansible_python_interpreter": sys.executable, "ansible_become": False, "sglang_host_checks": False,
          "host_lock_path": tbi.LOCAL_LOCK % tmp_path}
    env = tbi.controller_env(tmp_path)
    argv = ["ansible-playbook", "-i", str(ROOT / "inventory" / "sandbox"), "site.yml", "--tags", "preflight",
            "-l", "b300a,b300b", "-c", "local", "-e", "@%s" % varsfile,
            "-e", json.dumps(hw)]
    rc, out = controller_run(argv, tmp_path, {k: env[k] for k in ("HWEMU_ROOT",)})
    assert rc != 0 and "sglang_api_key: (secret, value not shown" in out, out[-3000:]
    assert not traces(key, {"output (-vvv)": out}, [tmp_path / "ansible.log", tmp_path / "facts",
                                                   tmp_path / "local-tmp", ROOT / "artifacts"]), out[-3000:]
    assert (tmp_path / "ansible.log").stat().st_size > 1000   # the log is the real thing
    # the search itself finds a key where there is one (a file of a scanned place, the output)
    (tmp_path / "facts" / "control").parent.mkdir(exist_ok=True)
    (tmp_path / "facts" / "control").write_text("x" + key.strip()[8:] + "x")
    assert traces(key, {"out": "y" + key.strip() + "y"}, [tmp_path / "facts"]) == ["out", str(tmp_path / "facts" / "control")]


def rolling_restart(sandbox, tmp, *extra):
    argv = ["ansible-playbook", "-i", sandbox.inventory, "playbooks/rolling_restart.yml", "-l", "b300a,b300b",
            "-e", "sglang_profile=kimi_k3", "-e", "sglang_router_ready_timeout_s=10",
            "-e", "sglang_reachability_check=false"] + list(extra)
    return controller_run(argv, tmp, {k: v for k, v in sandbox.env.items() if k.startswith("CONTAINERS")})


def test_key_the_router_rejects_in_no_output_or_artifact(sandbox, keyed, tmp_path):
    """The router's env file says another key than the one its process holds (a hand edit, an interrupted run): the
    role's router calls send the file's key, the router answers 401, the run fails; neither key is anywhere."""
    key, _ = keyed
    other = "sk-b300-" + secrets.token_hex(16)
    sandbox.exec("b300a", "cp -p /etc/sglang/router.env /root/router.env.keep && "
                 "sed -i 's/^SGLANG_API_KEY=.*/SGLANG_API_KEY=\"%s\"/' /etc/sglang/router.env" % other)
    try:
        rc, out = rolling_restart(sandbox, tmp_path, "-e", "@%s" % keyed_vars(sandbox, tmp_path, other),
                                  "-e", '{"sglang_rolling_instances": ["b300a/W0"]}')
    finally:
        sandbox.exec("b300a", "mv /root/router.env.keep /etc/sglang/router.env")
    assert rc != 0 and "Rolling restart stopped at b300a/W0" in " ".join(out.split()), out[-3000:]
    assert not traces(key, {"output (-vvv)": out}, artifact_dirs(tmp_path)), "the router's key leaked"
    assert not traces(other, {"output (-vvv)": out}, artifact_dirs(tmp_path)), "the rejected key leaked"
    assert chat(key)[0] == 200


def test_unreachable_router_in_no_output_or_artifact(sandbox, keyed, tmp_path):
    """The router's URL answers nothing (a port nothing listens on): the router calls fail, nothing was changed, and
    the key is nowhere in the output or the controller-side artifacts."""
    key, _ = keyed
    rc, out = rolling_restart(sandbox, tmp_path, "-e", "@%s" % keyed_vars(sandbox, tmp_path, key),
                              "-e", '{"sglang_profile_overrides": {"router": {"port": 30099, "backend_port": 40099}}}',
                              "-e", '{"sglang_rolling_instances": ["b300a/W0"]}')
    assert rc != 0 and "STILL in the router" in " ".join(out.split()), out[-3000:]
    assert not traces(key, {"output (-vvv)": out}, artifact_dirs(tmp_path)), "the key leaked"
    assert chat(key)[0] == 200


def artifact_dirs(tmp):
    """The controller-side traces of a run (controller_run): log, fact cache, Ansible's temp; and artifacts/. Not tmp
    itself: the test's own vars file holding the key lives there (keyed_vars)."""
    return [tmp / "ansible.log", tmp / "facts", tmp / "local-tmp", ROOT / "artifacts"]


def keyed_vars(sandbox, tmp, key):
    (tmp / "inputs").mkdir(exist_ok=True)
    path = pathlib.Path(tempfile.mkstemp(dir=tmp / "inputs", suffix=".yml")[1])
    path.write_text(yaml.safe_dump({"sglang_api_key": key}))
    return path
