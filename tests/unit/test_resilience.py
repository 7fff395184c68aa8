"""Issue 15: router flag sets (seed | resilient) and the API key launcher (roles/sglang/files/sglang_launch.py)."""
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import test_sglang_plan as tsp

ROOT = pathlib.Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "roles" / "sglang" / "files" / "sglang_launch.py"


@pytest.mark.parametrize("profile", ["kimi_k3", "glm52_pd"])
def test_resilient_flag_set_turns_retries_on_and_passes_the_router_catalog(profile):
    prof = tsp.load_profile(profile)
    shared = tsp.router_flag_sets()
    assert tsp.sp.router_flag_set_names(prof, shared) == ["resilient", "seed"]
    assert tsp.sp.router_flag_set(prof, shared, "seed") == {}, "seed must stay the seed's exact router flags"
    res = tsp.plan(profile, router_flag_set="resilient")
    assert res["errors"] == [], res["errors"]
    args = res["router"]["args"]
    assert "--disable-retries" not in args
    assert tsp.flag_value(args, "--retry-max-retries") == "5"
    assert tsp.flag_value(args, "--cb-failure-threshold") == "3"
    assert tsp.flag_value(args, "--health-check-interval-secs") == "5"
    seed = tsp.plan(profile, router_flag_set="seed")
    assert seed["errors"] == [] and "--disable-retries" in seed["router"]["args"]


def run_launcher(tmp_path, argv, key="sk-test-SECRET-4242"):
    env = dict(os.environ, SGLANG_API_KEY=key)
    env.pop("SGLANG_LAUNCH_REEXEC", None)
    return subprocess.run([sys.executable, str(LAUNCHER)] + argv, env=env, capture_output=True, text=True,
                          timeout=60, check=False)


def test_launcher_keeps_the_key_off_argv_and_redacts_the_log(tmp_path):
    key = "sk-test-SECRET-4242"
    exe = tmp_path / "fake-sglang"
    out = tmp_path / "seen"
    exe.write_text(textwrap.dedent('''\
        #!%s
        import os, sys
        open(%r, "w").write(repr(sys.argv[1:]) + "\\n"
                            + open("/proc/self/cmdline", "rb").read().replace(b"\\0", b" ").decode() + "\\n"
                            + open("/proc/%%d/cmdline" %% os.getppid(), "rb").read().replace(b"\\0", b" ").decode()
                            + "\\n" + str("SGLANG_API_KEY" in os.environ))
        print("INFO server_args=ServerArgs(port=1, api_key='%%s')" %% sys.argv[-1], flush=True)
        sys.stderr.write("stderr Authorization: Bearer %%s\\n" %% sys.argv[-1])
        ''' % (sys.executable, str(out))))
    exe.chmod(0o755)
    r = run_launcher(tmp_path, [str(exe), "serve", "--port", "1", "--api-key", "${SGLANG_API_KEY}"])
    assert r.returncode == 0, r.stderr
    argv_seen, own_cmdline, parent_cmdline, env_has_key = out.read_text().splitlines()
    assert argv_seen == repr(["serve", "--port", "1", "--api-key", key]), "the server must get the key in sys.argv"
    assert key not in own_cmdline and "${SGLANG_API_KEY}" in own_cmdline, own_cmdline
    assert key not in parent_cmdline
    assert env_has_key == "False", "the key must leave the environment of the server (children inherit it)"
    assert key not in r.stdout + r.stderr
    assert "api_key='<redacted>'" in r.stdout and "Bearer <redacted>" in r.stdout, r.stdout


def test_launcher_refuses_a_token_without_a_key(tmp_path):
    exe = tmp_path / "x"
    exe.write_text("#!%s\nprint('ran')\n" % sys.executable)
    exe.chmod(0o755)
    r = run_launcher(tmp_path, [str(exe), "--api-key", "${SGLANG_API_KEY}"], key="")
    assert r.returncode == 2 and "SGLANG_API_KEY is empty" in r.stderr and "ran" not in r.stdout


def test_launcher_module_mode(tmp_path):
    r = run_launcher(tmp_path, [sys.executable, "-m", "json.tool", "--help"])
    assert r.returncode == 0 and "json.tool" in r.stdout


def test_launcher_waits_for_its_log_filter_before_it_exits(tmp_path):
    """The main process exits only after the filter wrote the last line and exited (reaped): systemd's KillMode=mixed
    then finds no process left to SIGKILL mid-write. The target ends with sys.exit(3), as a server's main may."""
    exe = tmp_path / "fake-server"
    pidfile = tmp_path / "filter-pid"
    exe.write_text(textwrap.dedent('''\
        #!%s
        import os, sys
        kids = [int(p) for p in open("/proc/self/task/%%d/children" %% os.getpid()).read().split()]
        open(%r, "w").write(" ".join(map(str, kids)))
        print("last line before exit", flush=True)
        sys.exit(3)
        ''' % (sys.executable, str(pidfile))))
    exe.chmod(0o755)
    r = run_launcher(tmp_path, [str(exe), "serve", "--api-key", "${SGLANG_API_KEY}"])
    assert r.returncode == 3, r.stderr                        # the target's exit status is kept
    assert "last line before exit" in r.stdout                # written by the filter before the main process ended
    (filter_pid,) = [int(p) for p in pidfile.read_text().split()]
    assert not pathlib.Path("/proc/%d" % filter_pid).exists(), "the filter outlived the main process"
