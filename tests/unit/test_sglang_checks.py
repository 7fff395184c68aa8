"""roles/sglang's preflight decisions and messages (module_utils/sglang/sglang_checks.py), which the task files used to build
in Jinja: the TCP paths between hosts, the GPU boot services, a role script's problems, the smoke answers."""
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_checks as sc

PD = {"instances": [
    {"id": "b300a/P0", "host": "b300a", "role": "prefill", "address": "10.0.0.11", "port": 30001, "bootstrap_port": 8998},
    {"id": "b300a/P1", "host": "b300a", "role": "prefill", "address": "10.0.0.11", "port": 30002, "bootstrap_port": 8999},
    {"id": "b300b/D0", "host": "b300b", "role": "decode", "address": "10.0.0.12", "port": 33002, "bootstrap_port": None},
    {"id": "b300b/D1", "host": "b300b", "role": "decode", "address": "10.0.0.12", "port": 33003, "bootstrap_port": None},
], "router": {"host": "b300a"}}


def test_reach_paths_router_to_workers_and_decode_to_bootstrap():
    paths = sc.reach_paths(PD, ["b300a", "b300b"])
    got = [(p["src"], p["dst"], p["port"], p["what"]) for p in paths]
    assert got == [("b300a", "b300a", 30001, "router -> worker b300a/P0 port"),
                   ("b300a", "b300a", 30002, "router -> worker b300a/P1 port"),
                   ("b300a", "b300b", 33002, "router -> worker b300b/D0 port"),
                   ("b300a", "b300b", 33003, "router -> worker b300b/D1 port"),
                   ("b300b", "b300a", 8998, "decode host -> prefill b300a/P0 bootstrap port"),
                   ("b300b", "b300a", 8999, "decode host -> prefill b300a/P1 bootstrap port")]
    # hosts outside the play are neither sources nor targets
    assert [(p["src"], p["dst"]) for p in sc.reach_paths(PD, ["b300a"])] == [("b300a", "b300a")] * 2
    assert sc.listen_specs(paths, "b300a") == ["30001", "30002", "8998", "8999"]
    assert sc.listen_specs(paths + paths[-1:], "b300a") == ["30001", "30002", "8998", "8999"], "a port once"


def test_reach_blocked_names_the_path_and_the_rule_that_opens_it():
    paths = sc.reach_paths(PD, ["b300a", "b300b"])
    results = [{"item": p, "elapsed": 0} for p in paths[:-1]] + [{"item": paths[-1], "msg": "Timeout when waiting"}]
    msgs = sc.reach_blocked(results, {"b300b": "10.0.0.12"}, 5)
    assert msgs == ["b300b -> b300a (10.0.0.11) tcp port 8999 (decode host -> prefill b300a/P1 bootstrap port): no "
                    "connection within 5 s (Timeout when waiting); expected it open from b300b (10.0.0.12). Likely a "
                    "firewall on b300a: nft add rule inet filter input ip saddr 10.0.0.12 tcp dport 8999 accept (ufw: "
                    "ufw allow from 10.0.0.12 to any port 8999 proto tcp), or a wrong sglang_advertise_address for "
                    "b300a"]


def test_boot_problems():
    svcs = ["nvidia-persistenced.service", "nvidia-fabricmanager.service"]
    ok = [{"item": svcs[0], "stdout": "enabled"}, {"item": svcs[1], "stdout": "static"}]
    pers = {"rc": 0, "stdout": "0, Enabled\n1, Enabled\n"}
    assert sc.boot_problems("b300a", svcs, ok, pers) == ""
    bad = [{"item": svcs[0], "stdout": "enabled"}, {"item": svcs[1], "stdout": "disabled"}]
    msg = sc.boot_problems("b300b", svcs, bad, pers)
    # the text tests/integration/test_boot_services.py reads
    assert msg.startswith("b300b: reboot readiness: found nvidia-fabricmanager.service not enabled; persistence mode on; ")
    assert "Fix: systemctl enable --now nvidia-persistenced.service nvidia-fabricmanager.service" in msg
    off = sc.boot_problems("b300a", svcs, ok, {"rc": 0, "stdout": "0, Enabled\n3, Disabled\n"})
    assert "found services enabled; persistence mode off on GPU 3;" in off
    gone = sc.boot_problems("b300a", svcs, ok, {"rc": 127, "stdout": "", "stderr": "not found\n"})
    assert "persistence mode unreadable: not found;" in gone


def test_script_problems():
    assert sc.script_problems({"rc": 2, "stdout": '{"problems": ["b300a: a", "b300a: b"]}'}, "b300a", "x.py") == \
        "b300a: a || b300a: b"
    assert sc.script_problems({"rc": 1, "stdout": "", "stderr": "Traceback ...\n"}, "b300a", "x.py") == \
        "b300a: x.py failed: Traceback ..."
    assert sc.script_problems({"rc": 1, "stdout": "not json"}, "h", "y.py") == "h: y.py failed: no output"


def test_smoke_answers_count_reasoning_content():
    ans = [{"json": {"choices": [{"message": {"content": "", "reasoning_content": "thinking"}}]}},
           {"json": {"choices": [{"message": {"content": "hi"}}]}},
           {"json": {"choices": [{"message": {"content": "", "reasoning_content": ""}}]}},
           {"json": {}}]
    assert sc.smoke_empty(ans) == [3, 4]
    assert sc.smoke_text(ans) == ("thinking", True)
    assert sc.smoke_text(ans[1:]) == ("hi", False)
    assert sc.smoke_text([]) == ("", False)


def test_flag_value():
    args = ["--host", "0.0.0.0", "--model-path", "/m", "--tokenizer-path", "/t"]
    assert sc.flag_value(args, ["--tokenizer-path", "--model-path"]) == "/t"
    assert sc.flag_value(args[:4], ["--tokenizer-path", "--model-path"]) == "/m"
    assert sc.flag_value(["--tokenizer-path"], ["--tokenizer-path"]) == ""
    assert sc.flag_value([], ["--x"]) == ""
