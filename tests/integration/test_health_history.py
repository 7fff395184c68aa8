"""Integration: roles/health_history on the running sandbox fleet (emulated hardware, SYNTHESIZED values).

Reuses the fleet the other tests deploy (SGLang is not redeployed: only playbooks/health_history.yml runs). b300a stays
`healthy`, b300b is switched to `thermal_throttle` (95-96 C, thermal violation). The role is installed with a 1 s
interval; after a few samples one counter of b300b's mlx5_3 is raised (root writes the emulated sysfs file, as the
mlx5 driver would), and the window read back through b300.rollout.health_history_read must show every GPU of b300b hot
(first hot moment, thermal violation seconds), none of b300a, and the counter delta on mlx5_3 only. Also: the unit runs
as the unprivileged user with its hardening in force, the node_exporter textfile is there, a second run changes
nothing, and `--tags history_read` writes window.json and the plot. A finalizer stops the 1 s sampler and puts both
hosts back to `healthy`.
"""
import json
import re
import time

import pytest

HOSTS = ("b300a", "b300b")
UNIT = "b300-health-history.service"
DIR = "/var/lib/b300-health-history"
TEXTFILE = "/var/lib/node_exporter/textfile_collector/b300_health_history.prom"
COUNTER = "/opt/hwemu/sys/class/infiniband/mlx5_3/ports/1/hw_counters/local_ack_timeout_err"
EXTRA = ["-e", "health_history_interval_s=1", "-e", "health_history_verify_timeout_s=30"]


def _recap(out):
    return dict(re.findall(r"^(b300[ab])\s+:\s+(.*)$", out, re.M))


@pytest.fixture(scope="module")
def installed(sandbox, request):
    sandbox.scenarios_back_to_healthy(request, HOSTS)
    request.addfinalizer(lambda: [sandbox.exec(h, "systemctl stop %s" % UNIT, check=False) for h in HOSTS])
    sandbox.scenario("b300a", "healthy")
    sandbox.scenario("b300b", "thermal_throttle")
    t0 = time.time()
    r = sandbox.ansible_playbook("playbooks/health_history.yml", *EXTRA, limit="b300a,b300b", check=False)
    return {"sandbox": sandbox, "rc": r.returncode, "out": r.stdout + r.stderr, "install_s": time.time() - t0, "t0": t0}


@pytest.fixture(scope="module")
def window(installed):
    sb = installed["sandbox"]
    assert installed["rc"] == 0, installed["out"][-4000:]
    time.sleep(3)
    sb.exec("b300b", "echo 41 > %s" % COUNTER)
    time.sleep(4)
    # the window starts at this module's install: site.yml (run by earlier tests) installed the sampler already, and
    # its samples from before the scenario switch (idle clocks, other tests' counters) are not this test's
    since = int(time.time() - installed["t0"]) + 1
    return sb.ansible_json("b300a,b300b", "b300.rollout.health_history_read", "since=%ds plot_context=0" % since)


def test_install_reports_what_it_samples(installed):
    assert installed["rc"] == 0, installed["out"][-4000:]
    out = " ".join(installed["out"].split())          # the callback wraps long messages
    nics = ",".join("mlx5_%d" % i for i in range(8))
    assert re.search(r"b300b: b300-health-history samples 8 GPUs and NICs %s every 1 s" % nics, out), out[-3000:]
    assert "hot now: 0,1,2,3,4,5,6,7" in out and re.search(r"b300a: .*hot now: no", out), out[-3000:]
    print("health_history install on 2 hosts: %.1f s" % installed["install_s"])


def test_hot_gpus_and_the_nic_that_counted(window):
    b, a = window["b300b"], window["b300a"]
    assert b["available"] and a["available"]
    assert b["window"]["samples"] >= 5, b["window"]
    assert sorted(b["gpus"], key=int) == [str(i) for i in range(8)]
    for i, g in b["gpus"].items():
        assert g["hot"] is True and g["max_temp_c"] in (95, 96), (i, g)
        assert g["max_mem_temp_c"] >= 91 and g["thermal_violation_s"] >= 3, (i, g)
        assert b["window"]["first_sample_epoch"] <= g["first_hot_epoch"] <= b["window"]["last_sample_epoch"]
    assert b["gpus"]["7"]["min_sm_clock_mhz"] == 1275            # thermal_throttle: 1380 - 15 x 7
    for i, g in a["gpus"].items():
        assert g["hot"] is False and g["max_temp_c"] < 90 and g["thermal_violation_s"] == 0, (i, g)
    # only the data NICs are sampled (never the fabric manager's CX7 mlx5_8), and only mlx5_3 counted
    assert sorted(b["nics"]) == ["mlx5_%d" % i for i in range(8)]
    assert b["nics"]["mlx5_3"]["local_ack_timeout_err"] == 41
    moved = {(n, c) for n, cs in b["nics"].items() for c, d in cs.items() if d}
    assert moved == {("mlx5_3", "local_ack_timeout_err")}, moved
    assert {"link_downed", "symbol_error", "port_xmit_data", "packet_seq_err"} <= set(b["nics"]["mlx5_0"])
    pd = b["plot_data"]
    assert sorted(pd["gpus"], key=int) == [str(i) for i in range(8)] and pd["gpus"]["0"]["throttled_intervals"]


def test_runs_unprivileged_and_hardened(installed):
    sb = installed["sandbox"]
    for h in HOSTS:
        show = sb.exec(h, "systemctl show %s -p ActiveState,User,NoNewPrivileges,ProtectSystem,ProtectHome,"
                          "PrivateTmp,DevicePolicy,CapabilityBoundingSet,RestrictAddressFamilies,"
                          "MemoryDenyWriteExecute,ProtectKernelTunables,UMask" % UNIT).stdout
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        assert props["ActiveState"] == "active" and props["User"] == "b300-health", props
        assert props["NoNewPrivileges"] == "yes" and props["ProtectSystem"] == "strict", props
        assert props["ProtectHome"] == "yes" and props["PrivateTmp"] == "yes" and props["DevicePolicy"] == "closed"
        assert props["CapabilityBoundingSet"] == "" and props["RestrictAddressFamilies"] == "AF_UNIX", props
        assert props["MemoryDenyWriteExecute"] == "yes" and props["ProtectKernelTunables"] == "yes", props
        pid = sb.exec(h, "systemctl show -p MainPID --value %s" % UNIT).stdout.strip()
        user = sb.exec(h, "ps -o user= -p %s" % pid).stdout.strip()
        assert user == "b300-health", user
        ls = sb.exec(h, "stat -c '%%U %%a' %s %s/current.jsonl" % (DIR, DIR)).stdout.split("\n")
        assert ls[0] == "b300-health 750" and ls[1] == "b300-health 640", ls
        # in force without namespaces: no new privileges, no capability at all, a seccomp filter
        # (SystemCallFilter, MemoryDenyWriteExecute, RestrictAddressFamilies, ...)
        status = dict(line.split(":", 1) for line in sb.exec(h, "cat /proc/%s/status" % pid).stdout.splitlines()
                      if ":" in line)
        assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2", status
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0 and int(status["CapAmb"], 16) == 0
        # mount namespace (ProtectSystem=strict, ReadWritePaths, PrivateTmp, ProtectHome): systemd sets it up where it
        # may; a Podman host without CAP_SYS_ADMIN makes systemd skip it ("assuming containerized execution")
        # (root in a Podman host lacks CAP_SYS_PTRACE: another user's ns link may be unreadable, then it is not known)
        own, init = (sb.exec(h, "readlink /proc/%s/ns/mnt" % p, check=False).stdout.strip() for p in (pid, 1))
        assert init, "pid 1's mount namespace unreadable on %s" % h
        if own and own != init:
            mounts = sb.exec(h, "awk '{print $5, substr($6, 1, 2)}' /proc/%s/mountinfo" % pid).stdout.splitlines()
            assert "/ ro" in mounts and "%s rw" % DIR in mounts, mounts
        else:
            print("%s: no (readable) mount namespace for the unit in this container (systemd skips it without CAP_SYS_ADMIN): "
                  "ProtectSystem/PrivateTmp/ProtectHome are configured (above) but only a real host enforces them" % h)
        verify = sb.exec(h, "systemd-analyze verify /etc/systemd/system/%s 2>&1; echo rc=$?" % UNIT).stdout.strip()
        assert verify == "rc=0", verify
        sec = sb.exec(h, "systemd-analyze security --no-pager %s | tail -1" % UNIT, check=False)
        print("%s: %s" % (h, (sec.stdout or sec.stderr).strip()))


def test_textfile(installed, window):
    sb = installed["sandbox"]
    text = sb.exec("b300b", "cat %s" % TEXTFILE).stdout
    assert 'b300_gpu_temperature_celsius{gpu="0"} 96' in text
    assert 'b300_gpu_thermal_violation{gpu="7"} 1' in text
    assert 'b300_rdma_hw_counter{device="mlx5_3",port="1",counter="local_ack_timeout_err"} 41' in text
    assert 'b300_ib_port_counter{device="mlx5_0",port="1",counter="symbol_error"} 0' in text
    assert "b300_health_history_dmon_up 1" in text
    mode = sb.exec("b300b", "stat -c %%a %s" % TEXTFILE).stdout.strip()
    assert mode == "644"


def test_second_run_in_check_mode_changes_nothing(installed, window):
    """Idempotence and check mode in one run: an installed host reports nothing to change under --check."""
    r = installed["sandbox"].ansible_playbook("playbooks/health_history.yml", "--check", *EXTRA,
                                              limit="b300a,b300b", check=False)
    recap = _recap(r.stdout)
    assert r.returncode == 0 and all("changed=0" in recap[h] for h in HOSTS), (recap, r.stdout[-3000:])


def test_read_playbook_writes_window_and_plot(installed, window):
    sb = installed["sandbox"]
    r = sb.ansible_playbook("playbooks/health_history.yml", "--tags", "history_read", "-e", "since=5m",
                            limit="b300b", check=False)
    assert r.returncode == 0, r.stdout[-3000:]
    out = " ".join(r.stdout.split())    # the yaml callback folds a long msg at spaces, where depends on its length
    assert "hot GPUs 0,1,2,3,4,5,6,7" in out and "mlx5_3: local_ack_timeout_err +41" in out, r.stdout[-3000:]
    d = sb.root / "artifacts" / "health-history" / "b300b"
    data = json.loads((d / "window.json").read_text())
    assert data["gpus"]["3"]["hot"] is True
    png = (d / "window.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20000
