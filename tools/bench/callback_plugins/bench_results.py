"""Callback bench_results: every task result of a playbook run, as JSON in the file $BENCH_RESULTS_FILE, for
tools/bench/weights_bench.py --local (the lent GPU machine carries ansible-core only, not the ansible.posix
collection whose json callback the sandbox mode reads). The same shape as that callback's output: {"plays": [{"play":
{"name"}, "tasks": [{"task": {"name"}, "hosts": {host: result}}]}]}, so one parser reads both. Enabled only where
named: ANSIBLE_CALLBACK_PLUGINS=tools/bench/callback_plugins ANSIBLE_CALLBACKS_ENABLED=bench_results."""
import json
import os

from ansible.plugins.callback import CallbackBase


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "bench_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.doc = {"plays": []}

    def v2_playbook_on_play_start(self, play):
        self.doc["plays"].append({"play": {"name": play.get_name()}, "tasks": []})

    def v2_playbook_on_task_start(self, task, is_conditional):
        if self.doc["plays"]:
            self.doc["plays"][-1]["tasks"].append({"task": {"name": task.get_name()}, "hosts": {}})

    def _record(self, result, **extra):
        if not (self.doc["plays"] and self.doc["plays"][-1]["tasks"]):
            return
        res = getattr(result, "result", None)   # ansible-core 2.19: .result; older: ._result
        res = dict(res if res is not None else result._result, **extra)
        self.doc["plays"][-1]["tasks"][-1]["hosts"][result._host.get_name()] = res

    def v2_runner_on_ok(self, result):
        self._record(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._record(result, failed=True)

    def v2_runner_on_unreachable(self, result):
        self._record(result, unreachable=True)

    def v2_playbook_on_stats(self, stats):
        path = os.environ.get("BENCH_RESULTS_FILE")
        if path:
            with open(path, "w") as fh:
                json.dump(self.doc, fh, default=str)
