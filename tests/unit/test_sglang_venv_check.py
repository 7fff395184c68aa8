"""roles/sglang/files/sglang_venv_check.py: the venv coherence check (CUDA major of every libcudart user vs torch's,
libraries resolve, package named with both majors and the fix)."""
import glob
import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

import sglang_venv_check as vc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "roles", "sglang", "files", "sglang_venv_check.py")
WHEELHOUSE = os.path.join(ROOT, ".cache", "wheelhouse")

CC = shutil.which("cc") or shutil.which("gcc")


def _venv(tmp_path, torch_cuda="13.0"):
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if torch_cuda is not None:
        (site / "torch").mkdir()
        (site / "torch" / "version.py").write_text(
            "__version__ = '2.11.0'\ncuda: Optional[str] = %r\nhip = None\n" % torch_cuda)
    return tmp_path / "venv", site


def _dist(site, name, files):
    di = site / ("%s-0.3.13.post1.dist-info" % name.replace("-", "_"))
    di.mkdir()
    (di / "METADATA").write_text("Metadata-Version: 2.1\nName: %s\nVersion: 0.3.13.post1\n" % name)
    (di / "RECORD").write_text("".join("%s,,\n" % f for f in files))


def _so(tmp_path, out, needed_soname, rpath=None):
    """A real shared object with NEEDED needed_soname (linked against an empty stub of that soname)."""
    stubdir = tmp_path / "stubs"
    stubdir.mkdir(exist_ok=True)
    stub = stubdir / needed_soname
    src = tmp_path / "x.c"
    src.write_text("int x(void) { return 1; }\n")
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(stub), "-Wl,-soname," + needed_soname, str(src)], check=True)
    args = [CC, "-shared", "-fPIC", "-o", str(out), str(src), "-Wl,--no-as-needed", str(stub)]
    if rpath:
        args.append("-Wl,-rpath," + rpath)
    subprocess.run(args, check=True)


def test_torch_cuda_major_read_from_version_py(tmp_path):
    _venv_dir, site = _venv(tmp_path, "13.0")
    assert vc.torch_cuda_major(str(site)) == 13
    (site / "torch" / "version.py").write_text("cuda = '12.8'\n")
    assert vc.torch_cuda_major(str(site)) == 12
    (site / "torch" / "version.py").write_text("cuda: Optional[str] = None\n")
    assert vc.torch_cuda_major(str(site)) is None


@pytest.mark.skipif(not CC, reason="no C compiler")
def test_elf_needed_parsed_from_a_real_shared_object(tmp_path):
    out = tmp_path / "engine.so"
    _so(tmp_path, out, "libcudart.so.12", rpath="$ORIGIN/../x.libs")
    needed, rpath = vc.elf_dynamic(str(out))
    assert "libcudart.so.12" in needed
    assert rpath == ["$ORIGIN/../x.libs"]
    assert vc.elf_dynamic(str(tmp_path / "x.c")) is None


@pytest.mark.skipif(not CC, reason="no C compiler")
def test_wrong_cuda_major_refused_naming_package_file_both_majors_and_fix(tmp_path):
    venv, site = _venv(tmp_path, "13.0")
    (site / "mooncake").mkdir()
    _so(tmp_path, site / "mooncake" / "engine.so", "libcudart.so.12")
    _dist(site, "mooncake-transfer-engine", ["mooncake/engine.so"])
    res = vc.check(str(venv), "b300a", expect_major=13, packages=["mooncake-transfer-engine-cuda13"])
    assert not res["ok"]
    msg = res["problems"][0]
    for part in ("b300a", "mooncake/engine.so", "mooncake-transfer-engine)", "libcudart.so.12", "CUDA 12",
                 "CUDA 13", "install mooncake-transfer-engine-cuda13"):
        assert part in msg, (part, msg)


@pytest.mark.skipif(not CC, reason="no C compiler")
def test_matching_major_passes_and_unresolved_library_is_named(tmp_path):
    venv, site = _venv(tmp_path, "13.0")
    (site / "mooncake").mkdir()
    _so(tmp_path, site / "mooncake" / "engine.so", "libcudart.so.13")
    _so(tmp_path, site / "mooncake" / "store.so", "libnothere-b300.so.7")
    _dist(site, "mooncake-transfer-engine-cuda13", ["mooncake/engine.so", "mooncake/store.so"])
    assert vc.check(str(venv), "b300a", expect_major=13)["ok"]
    # with --check-libs: a library that is nowhere (not in RPATH, ld.so.cache, default dirs, the venv) is named
    res = vc.check(str(venv), "b300a", expect_major=13, check_libs=True,
                   packages=["mooncake-transfer-engine-cuda13"])
    assert not res["ok"]
    assert [p for p in res["problems"] if "store.so" in p and "needs libnothere-b300.so.7, not found" in p]
    # a library shipped by the CUDA wheels torch loads first (site-packages/nvidia/...) counts as found
    (site / "nvidia" / "x" / "lib").mkdir(parents=True)
    shutil.copy(tmp_path / "stubs" / "libnothere-b300.so.7", site / "nvidia" / "x" / "lib")
    assert vc.check(str(venv), "b300a", expect_major=13, check_libs=True,
                    packages=["mooncake-transfer-engine-cuda13"])["ok"]


@pytest.mark.skipif(not CC, reason="no C compiler")
def test_without_torch_the_expected_major_is_the_reference(tmp_path):
    venv, site = _venv(tmp_path, None)
    (site / "mooncake").mkdir()
    _so(tmp_path, site / "mooncake" / "engine.so", "libcudart.so.12")
    res = vc.check(str(venv), "b300b", expect_major=13)
    assert not res["ok"] and "CUDA 12" in res["problems"][0] and "CUDA 13" in res["problems"][0]
    assert vc.check(str(venv), "b300b", expect_major=12)["ok"]


def test_torch_of_another_cuda_major_than_the_sglang_version_is_refused(tmp_path):
    venv, _site = _venv(tmp_path, "12.8")
    res = vc.check(str(venv), "b300a", expect_major=13)
    assert not res["ok"] and "CUDA 12 build" in res["problems"][0] and "needs CUDA 13" in res["problems"][0]


# The REAL Mooncake wheels (both variants): from the sandbox wheelhouse when it has them, else downloaded once (no
# dependencies, ~100 MB each, a few seconds from the package index) into .cache/wheels-venv-check. The wheelhouse
# ships only the CUDA 13 build, and `make test` runs the unit tests before it builds the wheelhouse.
WHEEL_CACHE = os.path.join(ROOT, ".cache", "wheels-venv-check")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _wheel(pattern, requirement):
    for d in (WHEELHOUSE, WHEEL_CACHE):
        found = sorted(glob.glob(os.path.join(d, pattern)))
        if found:
            return found[0]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
            "--only-binary=:all:", "--python-version", "311", "--implementation", "cp", "--abi", "cp311",
            "-d", WHEEL_CACHE, requirement]
    for plat in PLATFORMS:
        argv[5:5] = ["--platform", plat]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    found = sorted(glob.glob(os.path.join(WHEEL_CACHE, pattern)))
    assert r.returncode == 0 and found, "could not get %s (pip download): %s" % (requirement, r.stderr[-2000:])
    return found[0]


def _install_wheel(whl, site):
    with zipfile.ZipFile(whl) as z:
        z.extractall(site)


def test_real_cuda12_wheel_in_a_cuda13_venv_is_refused_by_the_script(tmp_path):
    """Integration level: the script as the role runs it, on a venv holding the REAL plain Mooncake wheel
    (engine.so NEEDED libcudart.so.12) next to torch 13.0: exit 2, package and both majors named."""
    venv, site = _venv(tmp_path, "13.0")
    _install_wheel(_wheel("mooncake_transfer_engine-0.3.13.post1-*.whl", "mooncake-transfer-engine==0.3.13.post1"), site)
    needed, _rpath = vc.elf_dynamic(str(site / "mooncake" / "engine.so"))
    # real evidence: the libraries the engine links (readelf -d)
    for lib in ("libcudart.so.12", "libibverbs.so.1", "libmlx5.so.1", "libnuma.so.1", "libcurl.so.4", "libcuda.so.1"):
        assert lib in needed
    r = subprocess.run([sys.executable, SCRIPT, "--venv", str(venv), "--host", "b300a", "--expect-cuda-major", "13",
                        "--package", "mooncake-transfer-engine-cuda13", "--import", "mooncake.engine"],
                       capture_output=True, text=True, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    res = json.loads(r.stdout)
    engine = [p for p in res["problems"] if "/mooncake/engine.so " in p]
    assert engine, res["problems"]
    assert ("(mooncake-transfer-engine) links libcudart.so.12 (CUDA 12) but the venv is CUDA 13" in engine[0]
            and "install mooncake-transfer-engine-cuda13" in engine[0])


def test_real_cuda13_wheel_in_a_cuda13_venv_passes(tmp_path):
    venv, site = _venv(tmp_path, "13.0")
    _install_wheel(_wheel("mooncake_transfer_engine_cuda13-0.3.13.post1-*.whl",
                          "mooncake-transfer-engine-cuda13==0.3.13.post1"), site)
    r = subprocess.run([sys.executable, SCRIPT, "--venv", str(venv), "--host", "b300a", "--expect-cuda-major", "13",
                        "--package", "mooncake-transfer-engine-cuda13"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stdout
    assert json.loads(r.stdout)["checked"] > 0
