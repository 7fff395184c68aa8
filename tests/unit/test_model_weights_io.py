"""The weights stage's copy (module_utils/weights/model_weights_io.py): buffers filled before they reach the writer, the bytes
read before a source error hashed and written, the write-behind's calls in order, a failing write-back reported as
a write error, the server's ranges with its read-ahead."""
import errno
import hashlib
import os
import urllib.request

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights_io as mio


class Trickle:
    """A reader that returns at most `chunk` bytes per call (a pipe), then optionally fails."""

    def __init__(self, data, chunk, fail_after=None):
        self.data, self.chunk, self.off, self.fail_after, self.calls = data, chunk, 0, fail_after, 0

    def readinto(self, buf):
        if self.fail_after is not None and self.off >= self.fail_after:
            raise mio.SourceError("connection lost")
        self.calls += 1
        n = min(self.chunk, len(buf), len(self.data) - self.off)
        buf[:n] = self.data[self.off:self.off + n]
        self.off += n
        return n


def test_each_buffer_is_filled_before_it_is_handed_to_the_writer(tmp_path):
    data = os.urandom(300000)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    handed = []
    h = hashlib.sha256()
    n = mio.copy_stream(Trickle(data, 1000), fd, h, len(data), on_bytes=handed.append, bufsize=65536, depth=2)
    os.close(fd)
    assert n == len(data) and (tmp_path / "f").read_bytes() == data
    assert h.hexdigest() == hashlib.sha256(data).hexdigest()
    assert handed == [65536] * 4 + [300000 - 4 * 65536]      # 5 hand-overs, not 300


def test_the_bytes_read_before_a_source_error_are_hashed_and_written(tmp_path):
    data = os.urandom(100000)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    h = hashlib.sha256()
    rd = Trickle(data, 7000, fail_after=70000)
    with pytest.raises(mio.SourceError):
        mio.copy_stream(rd, fd, h, len(data), bufsize=65536)
    os.close(fd)
    kept = (tmp_path / "f").read_bytes()
    assert 65536 < rd.off < len(data)                          # the error came with a buffer half full
    assert kept == data[:rd.off] and h.hexdigest() == hashlib.sha256(kept).hexdigest()   # resumable there


def test_more_than_the_limit_is_read_one_byte_past_it(tmp_path):
    data = os.urandom(5000)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    assert mio.copy_stream(Trickle(data, 999), fd, hashlib.sha256(), 4000, bufsize=1024) == 4001
    os.close(fd)


class FakeSfr:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def __call__(self, fd, off, n, flags):
        self.calls.append((off, n, flags))
        if self.fail:
            import ctypes
            ctypes.set_errno(self.fail)
            return -1
        return 0


def test_write_behind_starts_each_window_and_waits_on_the_one_before(tmp_path, monkeypatch):
    sfr, dropped = FakeSfr(), []
    monkeypatch.setattr(mio, "_SFR", [sfr])
    monkeypatch.setattr(mio, "drop_cache", lambda fd, off=0, n=0: dropped.append((off, n)))
    data = os.urandom(10 * 4096 + 100)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    os.write(fd, b"x" * 4096)            # a resumed .part: the windows start at its end
    h = hashlib.sha256()
    mio.copy_stream(Trickle(data, 3000), fd, h, len(data), bufsize=4096, write_behind=3 * 4096, drop=True)
    os.close(fd)
    w, start, kick, wait = 3 * 4096, 4096, mio._SFR_WRITE, 7
    assert sfr.calls == [(start, w, kick), (start + w, w, kick), (start, w, wait), (start + 2 * w, w, kick),
                         (start + w, w, wait)]
    assert dropped == [(start, w), (start + w, w)]
    assert (tmp_path / "f").read_bytes() == b"x" * 4096 + data


@pytest.mark.parametrize("drop", [False, True])
def test_on_overlayfs_the_write_back_is_started_by_fadvise(tmp_path, monkeypatch, drop):
    sfr, dropped = FakeSfr(), []
    monkeypatch.setattr(mio, "_SFR", [sfr])
    monkeypatch.setattr(mio, "drop_cache", lambda fd, off=0, n=0: dropped.append((off, n)))
    assert mio.write_behind_how("overlay") == "fadvise" and mio.write_behind_how("xfs") == "sfr"
    data = os.urandom(3 * 4096)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    mio.copy_stream(Trickle(data, 4096), fd, hashlib.sha256(), len(data), bufsize=4096, write_behind=4096,
                    how="fadvise", drop=drop)
    os.close(fd)
    kicks = [(0, 4096), (4096, 4096), (8192, 4096)]      # each window as it is written (dirty: stays cached)
    assert sfr.calls == [] and dropped == ([(0, 4096), (4096, 4096), (0, 4096), (8192, 4096), (4096, 4096)]
                                           if drop else kicks)
    assert (tmp_path / "f").read_bytes() == data


def test_write_behind_off_or_unsupported_leaves_it_to_the_fdatasync(tmp_path, monkeypatch):
    sfr = FakeSfr(fail=errno.EINVAL)
    monkeypatch.setattr(mio, "_SFR", [sfr])
    data = os.urandom(40000)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    mio.copy_stream(Trickle(data, 4096), fd, hashlib.sha256(), len(data), bufsize=4096, write_behind=4096)
    assert len(sfr.calls) == 1               # EINVAL: tried once, then left to the kernel and the fdatasync
    mio.copy_stream(Trickle(data, 4096), fd, hashlib.sha256(), len(data), bufsize=4096, write_behind=None)
    assert len(sfr.calls) == 1
    os.close(fd)


def test_an_io_error_of_the_write_back_is_a_write_error(tmp_path, monkeypatch):
    monkeypatch.setattr(mio, "_SFR", [FakeSfr(fail=errno.EIO)])
    data = os.urandom(40000)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    with pytest.raises(mio.WriteError):
        mio.copy_stream(Trickle(data, 4096), fd, hashlib.sha256(), len(data), bufsize=4096, write_behind=4096)
    os.close(fd)


def test_the_real_sync_file_range_on_this_file_system(tmp_path):
    data = os.urandom(3 << 20)
    fd = os.open(str(tmp_path / "f"), os.O_RDWR | os.O_CREAT, 0o600)
    mio.copy_stream(Trickle(data, 65536), fd, hashlib.sha256(), len(data), bufsize=1 << 20, write_behind=1 << 20,
                    drop=True)
    os.fdatasync(fd)
    mio.drop_cache(fd)
    os.close(fd)
    assert (tmp_path / "f").read_bytes() == data


def test_the_server_sends_ranges_across_its_read_ahead_windows(tmp_path, monkeypatch):
    monkeypatch.setattr(mio, "WINDOW", 4096)
    data = os.urandom(5 * 4096 + 123)
    (tmp_path / "org" / "M").mkdir(parents=True)
    (tmp_path / "org" / "M" / "w.bin").write_bytes(data)
    srv = mio.WeightsServer("127.0.0.1", 0, "tok", [{"rel": "org/M", "names": {"w.bin"}, "root": str(tmp_path)}],
                            kind="source")
    port = srv.httpd.server_address[1]
    srv.start()
    try:
        for rng, want in ((None, data), ("bytes=5000-", data[5000:]), ("bytes=100-9000", data[100:9001])):
            req = urllib.request.Request("http://127.0.0.1:%d/v1/files/org/M/w.bin" % port,
                                         headers=dict({"Authorization": "Bearer tok"}, **({"Range": rng} if rng else {})))
            with urllib.request.urlopen(req, timeout=10) as r:
                assert r.read() == want
    finally:
        srv.stop()
