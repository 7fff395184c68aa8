"""sandbox/hwemu/hoststack.py (issue 36): the emulated driver, fabric manager and fabric follow the host's REAL dpkg
state, and every trap of the issue goes from that state through the stand-in tools into the stage's plan and proof.

Each test builds one emulated host in a temp dir: an emulator root for sandbox/hwemu (SYNTHESIZED hardware), a host
root with dpkg's status database (the file format dpkg writes; read back by the real ``dpkg-query --admindir``),
/etc/modules-load.d and /boot, a run dir that a "boot" empties (as /run is on the sandbox containers). The stand-in tools (nvidia-smi,
modinfo, modprobe, mokutil, nv-fabricmanager-emu) answer; ``host_stack_io.gather`` reads them exactly as
the module does on a sandbox host, except that the fabric manager's journal is what nv-fabricmanager-emu printed at the
"boot" (systemd's journal holds it on a sandbox host). "The stage" here applies the plan to the dpkg database as apt
would (install = the declared version, hold; remove; modprobe through the stand-in; restart or reboot), so the test
shows the fix the stage makes, or its refusal before anything changes. Packages: the stand-ins of
sandbox/hoststack_repo/build.py (real names and versions, Debian revision -0b300standin1). The stand-ins run in this
process (hwemu_cli.main, what every bin/ script calls); test_bin_scripts_run_the_same checks the scripts answer the
same. ~15 s for the file on the loaded 2-core machine (tests ~6 s; with subprocesses it was ~75 s).
"""
import contextlib
import io
import os
import platform
import shutil
import subprocess
import pathlib

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack as hs
from ansible_collections.b300.rollout.plugins.module_utils.hoststack import host_stack_io

ROOT = pathlib.Path(__file__).resolve().parents[2]
HWEMU = ROOT / "sandbox" / "hwemu"
import hwemu_cli  # noqa: E402  (sandbox/hwemu, on the path by pytest.ini: the code every bin/ stand-in runs)
SOURCE = "file:/opt/b300-hoststack-repo ./ Packages"
STACK = dict(yaml.safe_load((ROOT / "roles" / "host_stack" / "vars" / "stacks.yml").read_text())["host_stack_stacks"][
    "b300-noble-580.173"], apt_source_match=["file:/opt/b300-hoststack-repo"])
K = platform.release()
REV = "-0b300standin1"
NEWER = "580.178.04"


def declared():
    """{name: debian version} of the stand-ins of the declared stack (build.py's naming)."""
    out = {}
    for p in hs.stack_packages(STACK, K):
        v = p["version"] or "1.0"
        out[p["name"]] = v if "-" in v else v + REV
    return out


class Host:
    """One emulated host. Its stand-in tools run in this process (hwemu_cli.main, what each bin/ script calls, with
    the host's environment; ~10x cheaper than a python start per call) except in test_bin_scripts_run_the_same."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.emu = tmp / "hwemu"          # the emulator's root (HWEMU_ROOT): its sys tree, proc, state
        (self.emu / "bin").mkdir(parents=True)
        for name in ("nvidia-smi", "modinfo", "modprobe", "mokutil", "nv-fabricmanager-emu", "journalctl", "lsmod"):
            (self.emu / "bin" / name).symlink_to(HWEMU / "bin" / name)
        self.root = tmp / "host"
        self.run_dir = tmp / "run"
        (self.root / "var" / "lib" / "dpkg" / "info").mkdir(parents=True)
        (self.root / "etc" / "modules-load.d").mkdir(parents=True)
        (self.root / "boot").mkdir()
        self.vars = dict(HWEMU_ROOT=str(self.emu), HWEMU_HOSTNAME="b300a", HWEMU_RUN_DIR=str(self.run_dir),
                         HWEMU_HOST_ROOT=str(self.root), HWEMU_KERNEL=K, HWEMU_FABRIC_DELAY_S="0")
        self.env = dict(os.environ, **self.vars)
        self.pkgs = {}          # name -> (version, held)
        self.journal = ""
        self.tool("hwemu-scenario", "healthy")
        self.write_dpkg()

    def tool(self, name, *args):
        """The stand-in NAME run as its bin/ script runs it (hwemu_cli.main), in this process: (rc, stdout, stderr)."""
        saved = dict(os.environ)
        os.environ.update(self.vars)
        out, err, rc = io.StringIO(), io.StringIO(), 0
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                hwemu_cli.main(name, list(args))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return subprocess.CompletedProcess([name] + list(args), rc, out.getvalue(), err.getvalue())

    def write_dpkg(self):
        """dpkg's status file: one stanza per package, as dpkg writes it (Status: want ok installed)."""
        stanzas = ["Package: %s\nStatus: %s ok installed\nPriority: optional\nMaintainer: b300-rollout sandbox "
                   "<sandbox@invalid>\nArchitecture: all\nVersion: %s\nDescription: STAND-IN\n" % (
                       n, "hold" if held else "install", v) for n, (v, held) in sorted(self.pkgs.items())]
        (self.root / "var" / "lib" / "dpkg" / "status").write_text("\n".join(stanzas))

    def install(self, versions, held=True):
        for n, v in versions.items():
            self.pkgs[n] = (v, held)
        self.write_dpkg()

    def modules_load(self, names):
        (self.root / "etc" / "modules-load.d" / "b300-host-stack.conf").write_text("".join(n + "\n" for n in names))

    def boot(self):
        """A power cycle: /run emptied, then the emulated fabric manager unit starts (its output: the journal)."""
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.start_fm()

    def start_fm(self):
        # what systemd writes to the unit's journal before each start (nvtrust #128's journal)
        self.journal += "systemd[1]: Starting nvidia-fabricmanager.service - NVIDIA fabric manager service...\n"
        p = self.tool("nv-fabricmanager-emu", "--no-wait")
        self.journal += p.stdout
        if p.returncode:
            # what systemd adds to the unit's journal when ExecStart exits non-zero
            self.journal += "nvidia-fabricmanager.service: Failed with result 'exit-code'.\n"
        return p

    def gather(self):
        def run(argv):
            if not argv[0]:
                return ""
            name = os.path.basename(argv[0])
            if name == "journalctl":
                return self.journal
            if name in ("apt-cache", "apt-config"):
                return self.policy if name == "apt-cache" else ""
            if name == "dpkg-query":
                argv = [argv[0], "--admindir=%s" % (self.root / "var" / "lib" / "dpkg")] + argv[1:]
            if os.path.dirname(argv[0]) == str(self.emu / "bin"):
                p = self.tool(name, *argv[1:])
            else:
                p = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30)
            return p.stdout if p.returncode == 0 else ""

        def find(name, extra):
            for d in extra:
                if os.access(os.path.join(d, name), os.X_OK):
                    return os.path.join(d, name)
            return shutil.which(name)

        return host_stack_io.gather(run, find, STACK, root=str(self.root), bin_path=[str(self.emu / "bin")],
                                    sysfs_root=str(self.emu / "sys"), proc_root=str(self.emu / "proc"))

    policy = ""

    def offer(self, extra=None):
        """apt-cache policy (apt-cache(8) layout) of the stack's packages as the sandbox's one file: repository offers
        them, plus ``extra`` {name: [(version, source)]} (a second source)."""
        out = []
        for n, v in declared().items():
            inst = self.pkgs.get(n, (None,))[0]
            out += ["%s:" % n, "  Installed: %s" % (inst or "(none)"), "  Candidate: %s" % v, "  Version table:"]
            for ev, src in (extra or {}).get(n, []):
                out += ["     %s 500" % ev, "        500 %s" % src]
            out += ["%s%s 500" % (" *** " if inst == v else "     ", v), "        500 %s" % SOURCE]
            if inst:
                out += ["        100 /var/lib/dpkg/status"]
        self.policy = "\n".join(out) + "\n"

    def stage(self):
        """The stage on this host: plan; refuse, or apply as apt/dpkg/modprobe/systemd would. Returns the plan."""
        self.offer()
        state = self.gather()
        plan = hs.plan(STACK, state)
        if plan["refusals"]:
            return plan
        for n in plan["remove"]:
            self.pkgs.pop(n, None)
        for item in plan["install"]:
            n, v = item.split("=", 1)
            self.pkgs[n] = (v, n in plan["hold"])
        for n in plan["hold"]:
            self.pkgs[n] = (self.pkgs[n][0], True)
        self.write_dpkg()
        self.modules_load(STACK["modules_load_at_boot"])        # the role's /etc/modules-load.d file
        for m in plan["modprobe"]:
            assert self.tool("modprobe", m).returncode == 0
        if plan["reboot"]:
            self.boot()
        elif plan["restart"]:
            self.start_fm()
        return plan

    def verdicts(self):
        return {c["check"]: c for c in hs.checks(STACK, self.gather())}


@pytest.fixture()
def host(tmp_path):
    return Host(tmp_path)


def failing(v):
    return sorted(k for k, c in v.items() if c["verdict"] == "fail")


def good_host(host):
    host.install(declared())
    host.modules_load(STACK["modules_load_at_boot"])
    host.boot()
    return host


# ----------------------------------------------------------------------------------------------- the emulator alone
def test_untouched_host_shows_the_scenario_as_before(host):
    """No stand-in package: nvidia-smi is the scenario's (driver 580.159.04, fabric by boot age), as every existing
    fleet test expects; the fabric manager unit sleeps as it always did (here: returns at once, prints nothing)."""
    p = host.tool("nvidia-smi", "-q")
    assert p.returncode == 0 and "580.159.04" in p.stdout
    assert host.tool("nv-fabricmanager-emu", "--no-wait").stdout == ""
    assert not (host.emu / "proc" / "driver").exists()


def test_bin_scripts_run_the_same(host):
    """The bin/ scripts (what the sandbox hosts run) answer as the in-process calls of the other tests do."""
    good_host(host)

    def script(*argv):
        return subprocess.run([str(HWEMU / "bin" / argv[0])] + list(argv[1:]), env=host.env, capture_output=True,
                              text=True, timeout=60)
    for argv in (("nvidia-smi", "-q"), ("modinfo", "-k", K, "-F", "signer", "nvidia"), ("mokutil", "--sb-state"),
                 ("modprobe", "nvidia_peermem"), ("lsmod",)):
        p, q = script(*argv), host.tool(*argv)

        def stable(text):
            return [ln for ln in text.splitlines() if not ln.startswith("Timestamp")]
        assert (p.returncode, stable(p.stdout), p.stderr) == (q.returncode, stable(q.stdout), q.stderr), argv
        assert p.stdout or p.stderr, argv
    assert script("modinfo", "-k", K, "-F", "signer", "nvidia").stdout == "Canonical Ltd. Kernel Module Signing\n"


def test_real_dpkg_query_reads_the_emulated_database(host):
    host.install({"nvlsm": "2025.10.14-1"})
    p = subprocess.run(["dpkg-query", "--admindir=%s" % (host.root / "var" / "lib" / "dpkg"), "-W", "-f",
                        "${Package}\t${Version}\t${db:Status-Abbrev}\n"], capture_output=True, text=True)
    assert p.stdout == "nvlsm\t2025.10.14-1\thi \n"


def test_bare_host_has_no_driver_then_the_stage_takes_it_to_a_proven_stack(host):
    """A bare host (the first stand-in not yet there: the stage installs them all) to a proven stack in one stage run
    with a reboot; a second stage run changes nothing."""
    host.offer()
    v = host.verdicts()
    assert v["driver_open_flavour"]["verdict"] == "fail" and v["packages_declared"]["verdict"] == "fail"
    plan = host.stage()
    assert [i.split("=")[0] for i in plan["install"]] == list(declared()) and plan["reboot"]
    assert plan["refusals"] == [] and plan["restart"] == []
    v = host.verdicts()
    assert failing(v) == [], {k: v[k]["found"] for k in failing(v)}
    assert v["driver_open_flavour"]["found"] == "Open Kernel Module 580.173.02"
    assert v["fabric_state"]["found"].startswith("8 GPUs Completed/Success, ClusterUUID ")
    assert "ClusterUUID N/A" not in v["fabric_state"]["found"]
    assert v["modules_loaded"]["found"] == "loaded: nvidia, mlx5_core, mlx5_ib, ib_umad"
    # no /boot/config-* in the host (as in the sandbox's containers): the running kernel's /proc/config.gz
    assert v["gdr_path"]["found"] == "dma_buf (open kernel modules and CONFIG_PCI_P2PDMA=y)"
    again = host.stage()
    assert not again["acts"] and not again["reboot"] and again["restart"] == []


def test_installed_but_not_rebooted_no_driver_then_nvml_mismatch(host):
    """The driver packages in, no reboot yet: nvidia-smi cannot talk to a driver (none was loaded at this boot); the
    next boot loads the open module. A userspace build other than the module's: NVML's version mismatch."""
    host.boot()
    host.install(declared())
    p = host.tool("nvidia-smi", "-q")
    assert p.returncode == 9 and "couldn't communicate with the NVIDIA driver" in p.stdout
    host.boot()
    assert host.tool("nvidia-smi", "-q").returncode == 0
    host.install({"nvidia-driver-580-server-open": NEWER + REV})
    p = host.tool("nvidia-smi", "-q")
    assert p.returncode == 18 and "Driver/library version mismatch" in p.stdout


# ----------------------------------------------------------------------------------------------- the traps
def test_trap_proprietary_flavour(host):
    """The proprietary flavour on Blackwell: no GPU initialises (RmInitAdapter failed in the kernel log), the proof
    fails naming the flavour; the stage removes it, installs the open prebuilt modules and reboots: proven."""
    host.install({"nvidia-driver-580-server": "580.173.02" + REV, "nvidia-dkms-580": "580.173.02" + REV})
    host.boot()
    assert host.tool("nvidia-smi", "-q").stdout == "No devices were found\n"
    assert "RmInitAdapter failed! (0x62:0x1a:2631)" in host.tool("journalctl", "-k").stdout
    host.offer()
    v = host.verdicts()
    assert v["driver_open_flavour"]["found"] == "proprietary kernel module 580.173.02"
    assert "RmInitAdapter" in v["driver_open_flavour"]["expected"]
    plan = host.stage()
    assert plan["remove"] == ["nvidia-dkms-580", "nvidia-driver-580-server"] and plan["reboot"]
    assert failing(host.verdicts()) == []


def test_trap_nvlsm_missing(host):
    """Everything but nvlsm: the fabric manager's start finds no nvlsm binary, the fabric stays In Progress; the
    stage installs nvlsm and restarts the fabric manager (no reboot needed): Completed."""
    d = declared()
    d.pop("nvlsm")
    host.install(d)
    host.modules_load(STACK["modules_load_at_boot"])
    host.boot()
    assert "/opt/nvidia/nvlsm/sbin/nvlsm does not exist" in host.journal
    host.offer()
    v = host.verdicts()
    assert {"fabric_manager_journal", "fabric_state", "nvlsm_journal", "packages_declared"} <= set(failing(v))
    assert "State In Progress" in v["fabric_state"]["found"]
    fab = hs.parse_smi_q(host.tool("nvidia-smi", "-q").stdout)["gpus"][0]["fabric"]
    assert fab == {"state": "In Progress", "status": "N/A", "clique_id": "N/A", "cluster_uuid": "N/A",
                   "health_summary": "N/A"}
    plan = host.stage()
    assert plan["install"] == ["nvlsm=2025.10.14-1"] and not plan["reboot"]
    assert plan["restart"] == ["nvidia-fabricmanager"]
    assert failing(host.verdicts()) == []


def test_trap_ib_umad_not_loaded(host):
    """linux-modules-extra installed but only mlx5_ib loaded at boot: the start script sees no NVSwitch bridge,
    Pre-NVL5 / NV_WARN_NOTHING_TO_DO, In Progress; the stage loads ib_umad, writes it to modules-load.d and restarts
    the fabric manager."""
    host.install(declared())
    host.modules_load(["mlx5_ib"])
    host.boot()
    assert "Detected Pre-NVL5 system" in host.journal
    host.offer()
    v = host.verdicts()
    assert v["modules_loaded"]["found"] == "not loaded: ib_umad"
    assert {"modules_at_boot", "fabric_manager_journal", "fabric_state", "nvlsm_journal"} <= set(failing(v))
    plan = host.stage()
    assert plan["modprobe"] == ["ib_umad"] and plan["restart"] == ["nvidia-fabricmanager"] and not plan["reboot"]
    assert failing(host.verdicts()) == []


def test_purged_stand_ins_leave_no_driver_file_behind(host):
    good_host(host)
    assert (host.emu / "proc" / "driver" / "nvidia" / "version").exists()
    host.pkgs.clear()
    host.write_dpkg()
    assert host.tool("nvidia-smi", "-q").returncode == 0          # the scenario's again
    assert not (host.emu / "proc" / "driver" / "nvidia" / "version").exists()


def test_modprobe_without_linux_modules_extra_fails_like_kmod(host):
    host.install({k: v for k, v in declared().items() if not k.startswith("linux-modules-extra")})
    host.boot()
    p = host.tool("modprobe", "ib_umad")
    assert p.returncode == 1
    assert p.stderr == "modprobe: FATAL: Module ib_umad not found in directory /lib/modules/%s\n" % K


@pytest.mark.parametrize("held", [True, False], ids=["by-hand-held", "unattended-upgrade-unheld"])
def test_trap_fm_one_version_off(host, held):
    """The fabric manager one build ahead of the driver (by hand and held, or moved alone by an unattended upgrade
    and so not held): its real refusal in the journal, the fabric In Progress; the stage puts it back to the driver's
    version, holds it and restarts it."""
    good_host(host)
    host.install({"nvidia-fabricmanager-580": NEWER + REV}, held=held)
    host.start_fm()
    assert ("fabric manager NVIDIA GPU driver interface version %s don't match with driver version 580.173.02"
            % NEWER) in host.journal
    host.offer(extra={"nvidia-fabricmanager-580": [(NEWER + REV, "file:/opt/b300-hoststack-newer ./ Packages")]})
    state = host.gather()
    v = {c["check"]: c for c in hs.checks(STACK, state)}
    assert v["driver_fm_same_version"]["verdict"] == "fail"
    assert v["fabric_manager_journal"]["found"] == "fabric manager %s refuses driver 580.173.02" % NEWER
    assert (v["packages_held"]["verdict"] == "fail") is (not held)
    plan = host.stage()
    assert plan["install"] == ["nvidia-fabricmanager-580=580.173.02" + REV]
    assert plan["unhold"] == (["nvidia-fabricmanager-580"] if held else [])
    assert plan["restart"] == ["nvidia-fabricmanager"]
    assert failing(host.verdicts()) == []


def test_trap_second_source_offers_a_newer_driver(host):
    """A second apt source offers 580.178.04 (the CUDA repository's nvidia-open-580 of the field report): the plan
    installs the declared build exactly and says so; the same version offered in two builds is refused."""
    host.offer(extra={"nvidia-driver-580-server-open": [(NEWER + "-1", "https://cuda.invalid/ubuntu2404 Packages")]})
    plan = hs.plan(STACK, host.gather())
    assert "nvidia-driver-580-server-open=580.173.02" + REV in plan["install"]
    assert any("offers newer %s-1" % NEWER in n for n in plan["notes"])
    host.offer(extra={"nvidia-driver-580-server-open": [("580.173.02-1", "file:/opt/b300-hoststack-repo2 ./ Packages")]})
    plan = hs.plan(STACK, host.gather())
    assert any("offered in 2 builds" in r and "two sources" in r for r in plan["refusals"])


def test_trap_dkms_no_module_for_the_next_kernel(host):
    """A newer kernel in /boot (GRUB boots it next) for which no nvidia module exists (DKMS failed to build it): the
    stage refuses before touching anything, naming the kernel and the fix; the host's packages are unchanged."""
    nxt = K + "+next"
    (host.root / "boot" / ("vmlinuz-%s" % K)).write_text("")
    (host.root / "boot" / ("vmlinuz-%s" % nxt)).write_text("")
    host.install({"nvidia-driver-580-server": "580.173.02" + REV, "nvidia-dkms-580": "580.173.02" + REV})
    before = (host.root / "var" / "lib" / "dpkg" / "status").read_text()
    assert host.tool("modinfo", "-k", nxt, "-F", "filename", "nvidia").returncode == 1
    plan = host.stage()
    r = [x for x in plan["refusals"] if x.startswith("next_kernel_modules")]
    assert r and ("kernel %s has no nvidia, mlx5_ib, ib_umad" % nxt) in r[0] and "do not reboot until fixed" in r[0]
    assert (host.root / "var" / "lib" / "dpkg" / "status").read_text() == before


def test_trap_secure_boot_unsigned_module(host):
    """Secure Boot on and the nvidia module a DKMS build (unsigned): the proof fails naming the manual MOK enrolment
    (never by automation); the stage removes the DKMS package and installs the Canonical-signed prebuilt modules, and
    after the reboot the proof passes under Secure Boot. A DKMS build the plan would not remove is refused
    (tests/unit/test_host_stack.py, the plan alone)."""
    (host.emu / "state").mkdir(exist_ok=True)
    (host.emu / "state" / "secure_boot").write_text("enabled\n")
    host.install({"nvidia-driver-580-server": "580.173.02" + REV, "nvidia-dkms-580": "580.173.02" + REV,
                  "linux-modules-extra-%s" % K: "1.0" + REV})
    host.boot()
    assert host.tool("mokutil", "--sb-state").stdout == "SecureBoot enabled\n"
    host.offer()
    v = host.verdicts()
    assert v["secure_boot_signed"]["found"].startswith("Secure Boot enabled and nvidia for kernel %s unsigned" % K)
    assert "never by automation" in v["secure_boot_signed"]["fix"]
    plan = host.stage()
    assert plan["refusals"] == [] and plan["remove"] == ["nvidia-dkms-580", "nvidia-driver-580-server"]
    v = host.verdicts()
    assert v["next_kernel_modules"]["found"].endswith("(signed, Secure Boot on)") and failing(v) == []


def test_an_unprivileged_reader_of_the_emulated_proc_writes_nothing(tmp_path, monkeypatch):
    """The emulated /proc is brought up to date by every caller of the emulated tools; the health-history sampler's
    unprivileged user runs nvidia-smi dmon, and on a host the stage had installed it failed with PermissionError
    rewriting /opt/hwemu/proc/config.gz (site.yml after the stack, 2026-12-06). A reader that finds the files current
    writes nothing (real /proc files are world-readable), and the files are world-readable."""
    import hoststack
    v = {"loaded": ["nvidia", "mlx5_ib"], "snapshot": {"driver": {"version": "580.173.02", "flavour": "open"}}}
    hoststack.write_proc(str(tmp_path), v)                  # root, at boot: writes them
    for rel in ("config.gz", "modules", "driver/nvidia/version"):
        assert (tmp_path / "proc" / rel).stat().st_mode & 0o004, rel
    real_open, real_gzip_open = open, hoststack.gzip.open

    def no_write(opener):
        def guarded(path, mode="r", *a, **kw):
            if any(c in mode for c in "wax+"):
                raise PermissionError(13, "Permission denied", path)
            return opener(path, mode, *a, **kw)
        return guarded
    monkeypatch.setattr("builtins.open", no_write(real_open))
    monkeypatch.setattr(hoststack.gzip, "open", no_write(real_gzip_open))
    hoststack.write_proc(str(tmp_path), v)                  # the sampler's user: reads, finds them current
    with pytest.raises(PermissionError):                    # a change still needs the writer
        hoststack.write_proc(str(tmp_path), dict(v, loaded=["nvidia"]))
