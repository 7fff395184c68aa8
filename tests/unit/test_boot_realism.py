"""Issue 12 item 4 (sandbox side): the emulated boot is as unkind as a real one, and the worker units' fabric wait
(roles/sglang/files/sglang-wait-fabric) waits for it, bounded.

- hwemu: nvidia_uvm absent until `nvidia-modprobe -u` (state file under $HWEMU_RUN_DIR); fabric state "In Progress"
  until $HWEMU_FABRIC_DELAY_S after boot.
- sglang stub: exits like CUDA without nvidia_uvm and with error 802 before the fabric is Completed.
- sglang-wait-fabric: exit 1 naming the state after its timeout; exit 0 once Completed.
"""
import os
import pathlib
import subprocess

import sglang_stub

ROOT = pathlib.Path(__file__).resolve().parents[2]
HWEMU = ROOT / "sandbox" / "hwemu"
SMI = HWEMU / "bin" / "nvidia-smi"
WAIT = ROOT / "roles" / "sglang" / "files" / "sglang-wait-fabric"


def _env(tmp_path, delay):
    return dict(os.environ, HWEMU_RUN_DIR=str(tmp_path / "run"), HWEMU_FABRIC_DELAY_S=str(delay),
                HWEMU_ROOT=str(HWEMU), SGLANG_STUB_HWEMU_ROOT=str(HWEMU))


def test_fabric_in_progress_until_delay(tmp_path):
    late = subprocess.run([str(SMI), "-q"], env=_env(tmp_path, 1e12), capture_output=True, text=True, check=True)
    assert "In Progress" in late.stdout
    q = subprocess.run([str(SMI), "--query-gpu=fabric.state", "--format=csv,noheader"], env=_env(tmp_path, 0),
                       capture_output=True, text=True, check=True)
    assert set(q.stdout.split("\n")) - {""} == {"Completed"}


def test_stub_refuses_like_cuda_until_uvm_and_fabric(tmp_path):
    env = _env(tmp_path, 0)
    assert "nvidia_uvm not loaded" in sglang_stub.cuda_init_error(env)
    subprocess.run([str(HWEMU / "bin" / "nvidia-modprobe"), "-u", "-c=0"], env=env, check=True)
    assert (tmp_path / "run" / "nvidia-uvm").exists()
    assert sglang_stub.cuda_init_error(env) is None
    assert "error 802" in sglang_stub.cuda_init_error(_env(tmp_path, 1e12))


def test_fabric_wait_is_bounded_and_passes_when_completed(tmp_path):
    bad = subprocess.run(["sh", str(WAIT), str(SMI), "2"], env=_env(tmp_path, 1e12), capture_output=True, text=True,
                         timeout=60, check=False)
    assert bad.returncode == 1 and "8 In Progress" in bad.stderr and "nvidia-fabricmanager" in bad.stderr
    good = subprocess.run(["sh", str(WAIT), str(SMI), "2"], env=_env(tmp_path, 0), capture_output=True, text=True,
                          timeout=60, check=False)
    assert good.returncode == 0, good.stderr


def test_fabric_wait_does_not_pass_when_nvidia_smi_fails_or_lists_no_gpu(tmp_path):
    """No driver loaded yet (nvidia-smi exits 9 with its one-line message, as a real host before the driver loads) or
    an nvidia-smi that prints no GPU: no fabric state can be read, which used to count as no bad state - the wait
    said 'Completed on every GPU' and exited 0. Now it waits and fails naming nvidia-smi's exit and first line."""
    cases = {
        "nodriver": "echo 'NVIDIA-SMI has failed because it couldn'\"'\"'t communicate with the NVIDIA driver. Make sure "
                    "that the latest NVIDIA driver is installed and running.'; exit 9",
        "nogpu": "echo 'No devices were found'; exit 0",
    }
    for name, body in cases.items():
        smi = tmp_path / name
        smi.write_text("#!/bin/sh\n%s\n" % body)
        smi.chmod(0o755)
        r = subprocess.run(["sh", str(WAIT), str(smi), "2"], capture_output=True, text=True, timeout=60, check=False)
        assert r.returncode == 1 and "Completed on every GPU" not in r.stdout, (name, r.stdout, r.stderr)
        assert "0 GPU(s) listed" in r.stderr and "check the driver" in r.stderr, (name, r.stderr)
        assert ("exit 9, 0 GPU(s) listed: NVIDIA-SMI has failed" in r.stderr) == (name == "nodriver"), r.stderr


def test_fabric_wait_passes_on_the_real_h200_output(tmp_path):
    """A real single-H200 machine's nvidia-smi -q (this project's capture: one GPU, Fabric / State N/A: no NVLink
    fabric) passes at once."""
    real = ROOT / "sandbox" / "hwemu" / "real" / "nvidia-h200-vm" / "q.txt"
    smi = tmp_path / "smi"
    smi.write_text("#!/bin/sh\ncat '%s'\n" % real)
    smi.chmod(0o755)
    r = subprocess.run(["sh", str(WAIT), str(smi), "2"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 0 and "Completed on every GPU" in r.stdout, (real, r.stderr)
