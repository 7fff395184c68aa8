"""tools/bench/weights_bench.py --local (issue 40 part 2): the callback that records a local run's task results
(tools/bench/callback_plugins/bench_results.py) writes what the bench's parser (weights_bench.parse_run, shared with
the sandbox mode's ansible.posix json output) reads, and the local inventory is one host that is its own controller.
The results' shape copies the ansible.posix json callback's ({"plays": [{"tasks": [{"task": {"name"}, "hosts": {}}]}]},
the sandbox mode's input, tests/integration/test_weights.py reads the same); the stage's keys are the stage module's
RETURN (plugins/modules/model_weights_stage.py)."""
import importlib.util
import json
import os
import pathlib
import sys

import weights_bench as wb  # tools/bench/ (on sys.path through pytest.ini)
import weights_bench_local as wbl
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def callback_module():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "tools/bench/callback_plugins/bench_results.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CallbackModule()


class Named:
    def __init__(self, name):
        self.name = name

    def get_name(self):
        return self.name


class Result:
    """ansible-core 2.19's CallbackTaskResult (.result) or an older TaskResult (._result only)."""

    def __init__(self, host, res, new_api=True):
        self._host = Named(host)
        if new_api:
            self.result = res
        else:
            self._result = res


def test_callback_writes_what_parse_run_reads(tmp_path, monkeypatch):
    out = tmp_path / "run.json"
    monkeypatch.setenv("BENCH_RESULTS_FILE", str(out))
    cb = callback_module()
    cb.v2_playbook_on_play_start(Named("Weights | stage the model directories of the profile"))
    # the progress loop: the job state is read until it says finished; only the finished one counts
    cb.v2_playbook_on_task_start(Named("model_weights : Stage | stage job state"), False)
    cb.v2_runner_on_ok(Result("b300a", {"finished": 0, "started": 1}))
    cb.v2_playbook_on_task_start(Named("model_weights : Stage | stage job state"), False)
    cb.v2_runner_on_ok(Result("b300a", {"finished": 1, "elapsed_s": 12.5, "bytes_fetched": 2214592512,
                                        "weight_bytes_read": 0, "io": {"wchar": 2214592512}, "fsync_s": 0.11,
                                        "errors": [], "models": [{"writeback": "behind (sfr)"},
                                                                 {"writeback": "behind (sfr)"}]}, new_api=False))
    cb.v2_playbook_on_task_start(Named("model_weights : Cleanup | the controller's server ended"), False)
    cb.v2_runner_on_ok(Result("b300a", {"finished": 1, "served": {"moonshotai/Kimi-K3": {"bytes": 2147483648}}}))
    cb.v2_playbook_on_task_start(Named("Host lock | released"), False)
    cb.v2_runner_on_failed(Result("b300a", {"msg": "b300a: lock gone"}))
    cb.v2_playbook_on_stats(None)
    doc = json.loads(out.read_text())
    assert doc["plays"][0]["tasks"][-1]["hosts"]["b300a"] == {"msg": "b300a: lock gone", "failed": True}
    run = wb.parse_run(doc)
    st = run["stage"]["b300a"]
    assert (st["elapsed_s"], st["bytes_fetched"], st["fsync_s"], st["errors"]) == (12.5, 2214592512, 0.11, [])
    assert st["writeback"] == ["behind (sfr)"]
    assert run["served_by_controller"] == {"moonshotai/Kimi-K3": {"bytes": 2147483648}}


def test_callback_without_its_file_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv("BENCH_RESULTS_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    cb = callback_module()
    cb.v2_playbook_on_play_start(Named("p"))
    cb.v2_playbook_on_stats(None)
    assert list(tmp_path.iterdir()) == []


def test_local_inventory_is_one_host_its_own_controller(tmp_path):
    inv = wbl.inventory(tmp_path, "10.1.2.3")
    hosts = yaml.safe_load((inv / "hosts.yml").read_text())["all"]["children"]
    b300a = hosts["gpu_nodes"]["hosts"]["b300a"]
    assert (b300a["ansible_connection"], b300a["ansible_host"], b300a["ansible_python_interpreter"]) == \
        ("local", "10.1.2.3", sys.executable)
    # playbooks/weights.yml runs on gpu_nodes:sglang_router; the kimi_k3 plan puts the router on a GPU host
    assert list(hosts["sglang_router"]["hosts"]) == ["b300a"] and list(hosts["gpu_nodes"]["hosts"]) == ["b300a"]
    assert ("ansible_become" in b300a) == (os.geteuid() == 0) and b300a.get("ansible_become", False) is False
    assert (inv / "group_vars" / "all.yml").read_text() == (ROOT / "inventory/sandbox/group_vars/all.yml").read_text()


def test_shard_sizes_default_pattern_and_small_shards():
    """The default pattern is the sandbox mode's (8 GiB -> 2, 2, 1.5, 1.5, 1 GiB); at 2 GiB it is ONE shard, so a small
    local run needs --shard-gib for P files at once (the stage takes one directory's files P at a time)."""
    gib = 1 << 30
    assert wb.shard_sizes(8) == [2 * gib, 2 * gib, 3 * gib // 2, 3 * gib // 2, gib]
    assert wb.shard_sizes(2) == [2 * gib]
    assert wb.shard_sizes(2, 0.5) == [gib // 2] * 4
    assert wb.shard_sizes(2.2, 0.5) == [gib // 2] * 3 + [int(0.7 * gib)]   # a remainder under a shard joins the last
    assert len(wb.shard_sizes(24)) == 15 and sum(wb.shard_sizes(24)) == 24 * gib
