"""sglang-stub behaviour the acceptance role relies on (loopback only): the block prefix cache with eviction and
flush, SGLang-named counters per engine type, meta_info.cached_tokens, exact output length under ignore_eos, and the
PD KV pull that moves the emulated NIC counters (x4 units) only over RDMA (the tcp_fallback case)."""
import json
import time
import sys
import threading

import pytest

from test_sglang_stub import Stub, free_port, http

sys.dont_write_bytecode = True


def test_prefix_cache_blocks_capacity_eviction():
    import sglang_stub as st  # on sys.path through test_sglang_stub
    c = st.PrefixCache(4, 16)
    a = ["s%d" % i for i in range(12)] + ["qa", "qb", "qc", "qd"]
    assert c.match(a) == 0
    c.insert(a)
    assert c.match(a[:12] + ["x"] * 4) == 12      # shared system prompt: 3 full blocks hit
    c.insert(["z%d" % i for i in range(8)])        # 2 more blocks -> over 16 tokens: LRU blocks evicted
    assert c.evicted == 8 and c.match(a) < 12
    c.clear()
    assert c.match(a) == 0


def metrics(url):
    return http("GET", url + "/metrics")[1]


def decode_tokens(text):
    return sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines()
               if ln.startswith("sglang:realtime_tokens_total{") and 'mode="decode"' in ln)


def gen(url, text, body=None):
    b = {"text": text, "sampling_params": {"max_new_tokens": 7, "ignore_eos": True}, "stream": False}
    b.update(body or {})
    code, out, _ = http("POST", url + "/generate", b, timeout=30)
    assert code == 200, out
    return json.loads(out)


def test_unified_counters_and_exact_output_len(tmp_path):
    s = Stub(tmp_path, args=["--page-size", "1"])
    try:
        sysp = " ".join("w%d" % i for i in range(100))
        decode0 = decode_tokens(metrics(s.url))          # the server's own warm-up request is counted too
        r1 = gen(s.url, sysp + " q1 q2")
        r2 = gen(s.url, sysp + " q3 q4")
        assert r1["meta_info"]["cached_tokens"] == 0 and r2["meta_info"]["cached_tokens"] == 100
        assert r2["meta_info"]["completion_tokens"] == 7
        # SGLang labels the hit by cache source (device/host); "total" is only a fallback it never takes on a hit.
        # The stub counts a request after writing its answer (as the real server's collector may): wait, bounded.
        want = 'sglang:cached_tokens_total{cache_source="device",engine_type="unified",model_name="M"} 100.0'
        deadline = time.monotonic() + 10
        m = metrics(s.url)
        while (want not in m or decode_tokens(m) - decode0 < 14) and time.monotonic() < deadline:
            time.sleep(0.1)
            m = metrics(s.url)
        assert want in m
        assert decode_tokens(m) - decode0 == 14
        http("POST", s.url + "/flush_cache")
        assert gen(s.url, sysp + " q5 q6")["meta_info"]["cached_tokens"] == 0
    finally:
        s.stop()


def _sysfs(tmp_path, devs, state="4: ACTIVE"):
    root = tmp_path / "sys"
    for d in devs:
        p = root / "class" / "infiniband" / d / "ports" / "1"
        (p / "counters").mkdir(parents=True)
        (p / "state").write_text(state + "\n")
        (p / "counters" / "port_xmit_data").write_text("0\n")
        (p / "counters" / "port_rcv_data").write_text("0\n")
    return root


def counter(root, dev, name):
    return int((root / "class" / "infiniband" / dev / "ports" / "1" / "counters" / name).read_text())


@pytest.mark.parametrize("tcp", [False, True], ids=["rdma", "tcp_fallback"])
def test_pd_kv_pull_moves_nic_counters_only_over_rdma(tmp_path, tcp):
    root = _sysfs(tmp_path, ["mlx5_0", "mlx5_1"])
    env = {"SGLANG_STUB_SYSFS_ROOT": str(root), "SGLANG_STUB_KV_BYTES_PER_TOKEN": "1000"}
    boot = free_port()
    p = Stub(tmp_path, args=["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(boot),
                             "--disaggregation-ib-device", "mlx5_0"], env=env)
    d = Stub(tmp_path, args=["--disaggregation-mode", "decode", "--disaggregation-ib-device", "mlx5_1"], env=env)
    try:
        if tcp:   # Mooncake found no usable HCA on either side (both fell back quietly)
            p.control("mooncake_transport", "tcp")
            d.control("mooncake_transport", "tcp")
        text = " ".join("w%d" % i for i in range(50))
        for room, q in ((1, " a b"), (2, " c d")):
            extra = {"bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": room}
            # like the router: both at once (the prefill answers only after the decode pulled the KV)
            pre = threading.Thread(target=http, args=("POST", p.url + "/generate", dict({"text": text + q}, **extra)),
                                   kwargs={"timeout": 30})
            pre.start()
            out = gen(d.url, text + q, extra)
            pre.join(30)
        assert out["meta_info"]["cached_tokens"] == 50                 # the prefill's hit, carried by decode
        assert 'engine_type="prefill"' in metrics(p.url) and 'engine_type="decode"' in metrics(d.url)
        assert "sglang:kv_transfer_total_mb_count" in metrics(p.url)
        moved = (counter(root, "mlx5_0", "port_xmit_data"), counter(root, "mlx5_1", "port_rcv_data"))
        assert moved == ((0, 0) if tcp else (2 * 52 * 1000 // 4,) * 2)
    finally:
        d.stop()
        p.stop()


def test_force_hca_fails_instead_of_tcp(tmp_path):
    import subprocess
    from test_sglang_stub import BIN
    root = _sysfs(tmp_path, ["mlx5_0"], state="1: DOWN")
    proc = subprocess.run([sys.executable, str(BIN / "sglang-0.5.18"), "serve", "--model-path", "/m", "--port",
                           str(free_port()), "--disaggregation-mode", "decode", "--disaggregation-ib-device", "mlx5_0"],
                          env={"SGLANG_STUB_SYSFS_ROOT": str(root), "MC_FORCE_HCA": "1", "PATH": "/usr/bin:/bin",
                               "SGLANG_STUB_CONTROL_DIR": str(tmp_path / "ctl")},
                          capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 1 and "Found 0 HCAs" in proc.stderr and "initialization failed" in proc.stderr
