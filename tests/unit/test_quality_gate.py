"""tools/quality-gate and module_utils/verdicts/quality_gate.py (issue 37): answer checks written from the question set's raw
text, the committed question set is its generator's output, and against one stub worker on loopback (about 5 s): an
unchanged deployment passes, one whose single task type drops 5% while the mean drops 1% fails and is named."""
import json
import runpy
import subprocess
import sys

import pytest

from ansible_collections.b300.rollout.plugins.module_utils.verdicts import quality_gate as qg
from test_sglang_stub import Stub

ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "quality-gate"
QUESTIONS = ROOT / "tools" / "golive" / "questions.json"


def test_checks_read_the_answer_not_the_prompt():
    number = {"kind": "number", "answer": 83}
    assert qg.check_answer(number, "Host b305 reports 83 C.")
    assert not qg.check_answer(number, "Host b383 reports 38 C.")      # b383 is a host name, not a number
    assert qg.check_answer({"kind": "number", "answer": 66}, "31 + 37 - 2 = 66")
    label = {"kind": "label", "answer": "INC-47277"}
    assert qg.check_answer(label, "The ticket is inc-47277.") and not qg.check_answer(label, "INC-472770")
    assert not qg.check_answer({"kind": "label", "answer": "positive"}, "I cannot tell from the text given.")
    assert qg.check_answer(None, "x") is None


def test_the_committed_question_set_is_its_generators_output():
    gen = runpy.run_path(str(ROOT / "tools" / "golive" / "make_questions.py"))
    assert json.loads(QUESTIONS.read_text()) == gen["build"]()
    items = json.loads(QUESTIONS.read_text())["items"]
    by_type = {}
    for it in items:
        by_type.setdefault(it["task_type"], []).append(it)
        assert it["reference"] and (it["check"] is None or qg.check_answer(it["check"], it["reference"])), it["id"]
    assert {k: len(v) for k, v in by_type.items()} == {t: 20 for t in ("math", "table_qa", "extraction",
                                                                        "classification", "summary")}


def exact(a, b):
    return 1.0 if a == b else 0.0


def test_one_type_down_fails_while_the_mean_holds():
    items = [{"id": "%s%d" % (t, i), "task_type": t, "check": None} for t in "abcde" for i in range(20)]
    base = {it["id"]: "x" for it in items}
    cand = dict(base, c0="y")                              # 1 of 20 "c" items changed: c -5 points, mean -1
    v = qg.verdict(qg.scores(items, base, cand, exact))
    assert not v["passed"] and v["failed_types"] == ["c"]
    assert "quality gate FAILED for c." in v["message"] and "the mean alone would have passed" in v["message"]
    assert qg.verdict(qg.scores(items, base, base, exact))["passed"]
    loose = {"types": {"c": {"max_rouge_drop_points": 6.0}}}
    assert qg.verdict(qg.scores(items, base, cand, exact), loose)["passed"]


def gate(*args):
    return subprocess.run([sys.executable, str(TOOL)] + list(args), capture_output=True, text=True, timeout=120)


@pytest.fixture()
def book_stub(tmp_path):
    s = Stub(tmp_path, env={"SGLANG_STUB_ANSWER_BOOK": str(QUESTIONS)})
    yield s
    s.stop()


def test_the_gate_passes_an_unchanged_deployment_and_names_the_type_that_fell(tmp_path, book_stub):
    base = tmp_path / "baseline.json"
    r = gate("record", "--url", book_stub.url, "--out", str(base), "--identity", "flags=--tp-size 8")
    assert r.returncode == 0, r.stderr
    rec = json.loads(base.read_text())
    assert rec["identity"]["version"] == "0.5.18" and rec["identity"]["flags"] == "--tp-size 8"
    assert rec["settings"]["temperature"] == 0 and len(rec["answers"]) == 100

    same = gate("check", "--url", book_stub.url, "--baseline", str(base), "--out", str(tmp_path / "same"))
    assert same.returncode == 0, same.stdout + same.stderr
    assert json.loads((tmp_path / "same" / "quality-gate.json").read_text())["verdict"]["passed"]

    book_stub.control("degrade", "table_qa:0.05")          # one table question of 20 answered wrong
    worse = gate("check", "--url", book_stub.url, "--baseline", str(base), "--out", str(tmp_path / "worse"))
    assert worse.returncode == 1
    rep = json.loads((tmp_path / "worse" / "quality-gate.json").read_text())
    rows = {r["task_type"]: r for r in rep["verdict"]["rows"]}
    assert rep["verdict"]["failed_types"] == ["table_qa"]
    assert rows["table_qa"]["rouge_drop_points"] == 5.0 and rows["table_qa"]["accuracy_drop_points"] == 5.0
    assert rows["mean (all items)"]["rouge_drop_points"] == 1.0 and not rows["mean (all items)"]["failed"]
    assert "quality gate FAILED for table_qa" in worse.stderr
    assert "| table_qa | 0.950 | 5.0 |" in (tmp_path / "worse" / "quality-gate.md").read_text()


def test_a_baseline_of_other_questions_is_refused(tmp_path):
    base = tmp_path / "b.json"
    base.write_text(json.dumps({"questions_sha256": "0" * 64, "identity": {}, "answers": {}}))
    r = gate("check", "--url", "http://127.0.0.1:9", "--baseline", str(base))
    assert r.returncode == 2 and "recorded on another question set" in r.stderr


def test_the_answer_book_as_a_control_file(tmp_path):
    """The sandbox hosts' units set no SGLANG_STUB_ANSWER_BOOK: the operator copies the question set into the stub's
    control directory instead (docs/go-live-tuning.md)."""
    from test_sglang_stub import http
    item = json.loads(QUESTIONS.read_text())["items"][0]
    s = Stub(tmp_path)
    try:
        def answer():
            body = {"messages": [{"role": "user", "content": item["prompt"]}], "temperature": 0}
            return json.loads(http("POST", s.url + "/v1/chat/completions", body)[1])["choices"][0]["message"]["content"]
        assert answer().startswith("stub M on ")              # no book: the stub's own answer
        s.control("answer_book", QUESTIONS.read_text())
        assert answer() == item["reference"]
        s.control("degrade", "%s:1" % item["task_type"])
        assert answer() == "I cannot tell from the text given."
    finally:
        s.stop()
