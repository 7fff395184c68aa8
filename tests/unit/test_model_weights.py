"""The weights stage's decisions (module_utils/weights/model_weights.py) and its input rules, on plain data; and the sandbox's
pinned manifests against the stub models they describe. The copying itself: tests/unit/test_model_weights_stage.py."""
import json
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.common import input_rules as ir
from ansible_collections.b300.rollout.plugins.module_utils.weights import model_weights as mw
from ansible_collections.b300.rollout.plugins.modules import model_weights_plan as mwp

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHA_A, SHA_B, SHA_C = "a" * 64, "b" * 64, "c" * 64


def files(**sizes):
    return {n.replace("__", "/").replace("_dot_", "."): {"sha256": SHA_A, "size": s} for n, s in sizes.items()}


# --- manifests ----------------------------------------------------------------------------------------------------------
def test_manifest_in_sglang_format_parsed_and_digest_is_canonical():
    text = json.dumps({"files": {"config.json": {"sha256": SHA_A.upper(), "size": 10},
                                 "model-00001-of-00002.safetensors": {"sha256": SHA_B, "size": 5}}})
    m = mw.parse_manifest(text, "m.json")
    assert m == {"config.json": {"sha256": SHA_A, "size": 10},
                 "model-00001-of-00002.safetensors": {"sha256": SHA_B, "size": 5}}
    # the digest does not depend on key order or whitespace, only on names, sha256 and sizes
    again = mw.parse_manifest(json.dumps({"files": dict(reversed(list(json.loads(text)["files"].items())))}, indent=4),
                              "x")
    assert mw.manifest_digest(m) == mw.manifest_digest(again)
    changed = dict(m, **{"config.json": {"sha256": SHA_A, "size": 11}})
    assert mw.manifest_digest(changed) != mw.manifest_digest(m)
    # manifest_text is what SGLang's generate writes: json.dumps(indent=2, sort_keys=True)
    assert mw.manifest_text(m) == json.dumps({"files": m}, indent=2, sort_keys=True)


@pytest.mark.parametrize("data, expected", [
    ({"checksums": {"a": SHA_A}}, "deprecated {\"checksums\": ...} form (no sizes); regenerate it"),
    ({"files": {}}, "no \"files\" mapping"),
    ({"files": {"../etc/passwd": {"sha256": SHA_A, "size": 1}}}, "'../etc/passwd' is a path with an empty, '.' or '..'"),
    ({"files": {"/abs": {"sha256": SHA_A, "size": 1}}}, "'/abs' is an absolute path"),
    ({"files": {"a.part": {"sha256": SHA_A, "size": 1}}}, "a name the stage uses itself"),
    ({"files": {".b300-stage.json": {"sha256": SHA_A, "size": 1}}}, "a name the stage uses itself"),
    ({"files": {"a": {"sha256": "xyz", "size": 1}}}, "a: sha256 'xyz' is not 64 hex digits"),
    ({"files": {"a": {"sha256": SHA_A, "size": -1}}}, "a: size -1 is not a byte count"),
    ({"files": {"a": {"sha256": SHA_A, "size": True}}}, "a: size True is not a byte count"),
    ({"files": {"A.json": {"sha256": SHA_A, "size": 1}, "a.json": {"sha256": SHA_A, "size": 1}}}, "differ only in case"),
    ({"files": {"d": {"sha256": SHA_A, "size": 1}, "d/x": {"sha256": SHA_A, "size": 1}}}, "d is both a file and a dir"),
    ("[1, 2]", "expected a JSON object"),
    ("{not json", "not JSON"),
])
def test_bad_manifests_refused_naming_the_file_and_the_entry(data, expected):
    with pytest.raises(mw.ManifestError) as exc:
        mw.parse_manifest(json.dumps(data) if isinstance(data, dict) else data, "/inv/m.json")
    assert str(exc.value).startswith("/inv/m.json: ") and expected in str(exc.value)


def test_tokenizer_subset_and_fetch_order():
    f = files(config_dot_json=10, tokenizer_dot_json=20, **{"model-00001_dot_safetensors": 500,
                                                              "model-00002_dot_safetensors": 900,
                                                              "pytorch_model_dot_bin": 100})
    assert sorted(mw.subset(f, "tokenizer")) == ["config.json", "tokenizer.json"]
    assert mw.subset(f, "full") == f
    assert mw.fetch_order(f) == ["model-00002.safetensors", "model-00001.safetensors", "pytorch_model.bin",
                                 "tokenizer.json", "config.json"]


# --- which hosts need which model directories ---------------------------------------------------------------------------
PLAN_KIMI = {
    "instances": [
        {"id": "b300a/W0", "host": "b300a", "args": ["--model-path", "/models/moonshotai/Kimi-K3",
                                                     "--speculative-draft-model-path", "/models/RadixArk/Kimi-K3-DSpark"]},
        {"id": "b300b/W0", "host": "b300b", "args": ["--model-path=/models/moonshotai/Kimi-K3",
                                                     "--speculative-draft-model-path", "/models/RadixArk/Kimi-K3-DSpark"]},
    ],
    "router": {"host": "b300c", "args": ["--worker-urls", "x", "--tokenizer-path", "/models/moonshotai/Kimi-K3"]},
}


def test_models_by_host_from_the_plan_workers_full_router_tokenizer():
    out, errors = mw.models_by_host(PLAN_KIMI, "/models")
    assert errors == []
    assert out["b300a"] == {
        "/models/moonshotai/Kimi-K3": {"rel": "moonshotai/Kimi-K3", "need": "full", "for": ["b300a/W0 --model-path"]},
        "/models/RadixArk/Kimi-K3-DSpark": {"rel": "RadixArk/Kimi-K3-DSpark", "need": "full",
                                            "for": ["b300a/W0 --speculative-draft-model-path"]}}
    assert out["b300b"]["/models/moonshotai/Kimi-K3"]["need"] == "full"
    assert out["b300c"] == {"/models/moonshotai/Kimi-K3": {"rel": "moonshotai/Kimi-K3", "need": "tokenizer",
                                                           "for": ["router --tokenizer-path"]}}


def test_router_on_a_worker_host_needs_no_second_copy_and_a_path_outside_the_root_is_refused():
    plan = {"instances": [{"id": "b300a/P0", "host": "b300a", "args": ["--model-path", "/models/GLM-5.2-NVFP4"]},
                          {"id": "b300a/P1", "host": "b300a", "args": ["--model-path", "/data/other"]}],
            "router": {"host": "b300a", "args": ["--model-path", "/models/GLM-5.2-NVFP4"]}}
    out, errors = mw.models_by_host(plan, "/models/")
    assert out["b300a"]["/models/GLM-5.2-NVFP4"]["need"] == "full"
    assert out["b300a"]["/models/GLM-5.2-NVFP4"]["for"] == ["b300a/P0 --model-path", "router --model-path"]
    assert errors == ["b300a: b300a/P1 --model-path uses /data/other, which is not below sglang_model_root /models/: "
                      "the weights stage fetches <source>/<path below the root>; fix: keep every model directory under "
                      "sglang_model_root"]


def test_the_real_profiles_name_the_models_the_issue_names():
    """Both profiles' argv as the plan renders it: {model_root} and {model_path} filled like sglang_plan does."""
    for name, want in (("kimi_k3", {"moonshotai/Kimi-K3", "RadixArk/Kimi-K3-DSpark"}), ("glm52_pd", {"GLM-5.2-NVFP4"})):
        prof = yaml.safe_load((ROOT / ("roles/sglang/files/profiles/%s.yml" % name)).read_text())
        rels = set()
        for role in prof["roles"].values():
            for flag in ("--model-path", "--speculative-draft-model-path"):
                v = role["args"].get(flag)
                if v:
                    path = v.replace("{model_path}", "/models/" + prof["model_dir"]).replace("{model_root}", "/models")
                    rels.add(mw.model_rel(path, "/models"))
        assert rels == want, name


# --- one directory's state -----------------------------------------------------------------------------------------------
def marker_for(f, keys, digest=None):
    return mw.marker_doc("m", digest or mw.manifest_digest(f), f, keys, "path /src", "full", "t")


def test_judge_final_complete_only_with_the_marker_and_every_stat_equal():
    f = {"a": {"sha256": SHA_A, "size": 3}, "b": {"sha256": SHA_B, "size": 5}}
    keys = {"a": [3, 10, 100], "b": [5, 11, 101]}
    d = mw.manifest_digest(f)
    assert mw.judge_final(f, d, marker_for(f, keys), keys)["state"] == "complete"
    # a file touched (new mtime): the marker no longer proves it; same size -> hashed again (adopt), not re-fetched
    touched = dict(keys, b=[5, 12, 101])
    j = mw.judge_final(f, d, marker_for(f, keys), touched)
    assert j["state"] == "incomplete" and j["changed"] == ["b"] and j["unproven"] == {"b": [5, 12, 101]}
    # a file lost, one truncated
    j = mw.judge_final(f, d, marker_for(f, keys), {"a": [2, 10, 100]})
    assert j["missing"] == ["b"] and j["wrong_size"] == {"a": 2} and j["state"] == "incomplete"
    # a marker edited by hand (its file list does not hash to its claim) proves nothing
    bad = marker_for(f, keys)
    bad["files"]["a"]["sha256"] = SHA_C
    j = mw.judge_final(f, d, bad, keys)
    assert j["marker"] == "invalid" and j["state"] == "incomplete" and sorted(j["unproven"]) == ["a", "b"]
    # no directory
    assert mw.judge_final(f, d, None, {}, exists=False)["state"] == "absent"


def test_judge_final_relabel_when_every_file_is_proven_but_the_manifest_changed():
    old = {"a": {"sha256": SHA_A, "size": 3}, "gone": {"sha256": SHA_B, "size": 5}}
    new = {"a": {"sha256": SHA_A, "size": 3}}
    keys = {"a": [3, 10, 100], "gone": [5, 11, 101]}
    j = mw.judge_final(new, mw.manifest_digest(new), marker_for(old, keys), keys)
    assert j["state"] == "relabel" and j["good"] == {"a": [3, 10, 100]}


def test_plan_files_link_have_adopt_resume_fetch():
    f = {"link": {"sha256": SHA_A, "size": 10}, "have": {"sha256": SHA_B, "size": 20},
         "adopt": {"sha256": SHA_C, "size": 30}, "resume": {"sha256": SHA_A, "size": 40},
         "fetch": {"sha256": SHA_B, "size": 50}, "stale_part": {"sha256": SHA_C, "size": 60}}
    final = {"good": {"link": [10, 1, 1]}, "unproven": {"adopt": [30, 2, 2]}}
    staging = {"verified": {"have": {"sha256": SHA_B, "stat": [20, 3, 3]}},
               "parts": {"resume": SHA_A, "stale_part": SHA_A}}       # the stale part was for other bytes
    actions = {a["name"]: a for a in mw.plan_files(f, final, staging, {"have": [20, 3, 3]},
                                                   {"resume": 15, "stale_part": 7})}
    assert {n: a["action"] for n, a in actions.items()} == {
        "link": "link", "have": "have", "adopt": "adopt", "resume": "resume", "fetch": "fetch", "stale_part": "fetch"}
    assert actions["resume"]["offset"] == 15 and actions["resume"]["bytes"] == 25 and actions["resume"]["hash_bytes"] == 15
    assert actions["adopt"]["hash_bytes"] == 30 and actions["adopt"]["bytes"] == 0
    assert mw.space_need(list(actions.values()), f) == 25 + 50 + 60
    assert [a["name"] for a in mw.plan_files(f, final, staging, {"have": [20, 3, 3]}, {})][:2] == ["stale_part", "fetch"]
    # full verification: nothing is taken on a record's word
    full = {a["name"]: a["action"] for a in mw.plan_files(f, final, staging, {"have": [20, 3, 3]}, {}, verify_full=True)}
    assert full["link"] == "adopt" and full["have"] == "adopt"


def test_space_verdict_names_host_fs_need_available_and_shortfall():
    assert mw.space_verdict("b300a", "/models (ext4, /dev/nvme0n1p1)", 10, 100, 5, ["m"]) is None
    msg = mw.space_verdict("b300a", "/models (ext4, /dev/nvme0n1p1)", 400 * mw.GIB, 300 * mw.GIB, 20 * mw.GIB,
                           ["moonshotai/Kimi-K3", "RadixArk/Kimi-K3-DSpark"])
    assert msg == ("b300a: not enough free space on /models (ext4, /dev/nvme0n1p1) for moonshotai/Kimi-K3, "
                   "RadixArk/Kimi-K3-DSpark: need 420.0 GiB (400.0 GiB still to fetch + 20.0 GiB reserve, "
                   "model_weights_reserve_gib), available 300.0 GiB: short by 120.0 GiB; nothing was written; fix: "
                   "free 120.0 GiB there, or put sglang_model_root on a larger file system")


# --- fan-out --------------------------------------------------------------------------------------------------------------
def test_fanout_chain_seed_and_no_fanout():
    hosts = {"m": ["a", "b", "c"]}
    # nobody has it: a from the source, b from a, c from b (each byte leaves the source once)
    fo = mw.fanout(hosts, {}, True)
    assert fo[("m", "a")] == {"from": "source", "peer": None, "serves": True}
    assert fo[("m", "b")] == {"from": "peer", "peer": "a", "serves": True}
    assert fo[("m", "c")] == {"from": "peer", "peer": "b", "serves": False}
    # b lost its copy, a and c hold one: b pulls from a seed, the source is not touched
    fo = mw.fanout(hosts, {("m", "a"): "complete", ("m", "c"): "complete"}, True)
    assert fo[("m", "b")] == {"from": "peer", "peer": "a", "serves": False} and fo[("m", "a")]["serves"]
    assert ("m", "c") not in fo
    # without fan-out each host that needs it pulls from the source
    fo = mw.fanout(hosts, {("m", "a"): "complete"}, False)
    assert fo[("m", "b")]["from"] == fo[("m", "c")]["from"] == "source"


def test_stage_plan_assigns_sources_fallbacks_and_the_controller_server():
    m = {"rel": "org/M", "digest": "d1", "files": {}}
    plan = mw.stage_plan({"b300a": [m], "b300b": [m]}, {}, {"type": "path", "where": "controller", "path": "/src"},
                         "http://10.0.0.1:31990", {"b300a": "http://10.0.0.11:31990", "b300b": "http://10.0.0.12:31990"})
    a, b = plan["hosts"]["b300a"], plan["hosts"]["b300b"]
    assert a["stage"][0]["source"] == {"type": "controller", "url": "http://10.0.0.1:31990", "host": "controller"}
    assert a["serve"] == [m] and b["serve"] == []
    assert b["stage"][0]["source"] == {"type": "peer", "url": "http://10.0.0.11:31990", "host": "b300a"}
    assert b["stage"][0]["fallback"]["type"] == "controller"
    assert plan["controller"] == [m]
    # both complete: nothing to stage, no server
    done = mw.stage_plan({"b300a": [m], "b300b": [m]}, {"b300a": {"org/M": "complete"}, "b300b": {"org/M": "complete"}},
                         {"type": "http", "url": "https://mirror/m"}, "", {"b300a": "x", "b300b": "y"})
    assert done["hosts"] == {"b300a": {"stage": [], "serve": []}, "b300b": {"stage": [], "serve": []}}
    assert done["controller"] == []


# model_weights_source's shape is the module's argument spec (issue 39: declared where Ansible checks it); the messages
# below are Ansible's own, each naming the key, what was found and what is expected
@pytest.mark.parametrize("source, expected", [
    ({"type": "nfs"}, "value of type must be one of: none, path, http, s3, got: nfs found in source"),
    ({"type": "path"}, "type is path but all of the following are missing: path found in source"),
    ({"type": "path", "path": "/x", "where": "nfs"}, "value of where must be one of: host, controller, got: nfs"),
    ({"type": "s3", "endpoint": "https://s3"}, "type is s3 but all of the following are missing: bucket"),
    ({"type": "s3", "endpoint": "https://s3", "bucket": "b", "secret_key": "x"}, "source.secret_key"),
    ("http://x", "unable to convert to dict"),
])
def test_source_shape_is_the_modules_spec(source, expected):
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    errors = ArgumentSpecValidator({"source": mw.SOURCE_SPEC}).validate({"source": source}).error_messages
    assert any(expected in e for e in errors), errors


def test_a_good_source_passes_the_spec():
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    for source in ({"type": "none"}, {"type": "path", "path": "/srv/m", "where": "controller"},
                   {"type": "http", "url": "https://mirror/m"}, {"type": "s3", "endpoint": "https://s3", "bucket": "b"}):
        assert ArgumentSpecValidator({"source": mw.SOURCE_SPEC}).validate({"source": source}).error_messages == []


def test_the_module_runs_the_source_rule_on_its_option():
    """model_weights_source lives in roles/b300_defaults, not in the role's values: the module checks its option."""
    p = {"values": {}, "secrets": {}, "plan": {"instances": [], "router": None}, "model_root": "/models", "hosts": [],
         "manifest_dir": "/nonexistent", "digests": {},
         "source": {"type": "path", "path": "rel/dir", "where": "host"}}
    problems = mwp.step_models(p)["problems"]
    assert any(x.startswith("controller: model_weights_source: ") and "is not an absolute path" in x
               for x in problems), problems


def test_messages():
    want = {"sha256": SHA_B, "size": 9}
    msg = mw.mismatch_message("b300a", "org/M", "model-1.safetensors", "http://mirror/m", SHA_A, "9", want, "m.json")
    assert msg.startswith("b300a: org/M/model-1.safetensors from http://mirror/m: found sha256 %s, 9 bytes; expected "
                          "sha256 %s, 9 bytes (manifest m.json); the file was removed and is never served; the serving "
                          "copy is untouched" % (SHA_A, SHA_B))
    line = mw.progress_line("b300a", {"bytes_done": 100 * mw.GIB, "bytes_total": 400 * mw.GIB, "rate_bps": mw.GIB,
                                      "files_done": 16, "files_total": 64, "sources": ["http://mirror/m"]})
    assert line == ("b300a: 100.0 GiB of 400.0 GiB (25%) at 1.0 GiB/s, ETA 5 m 00 s; files 16/64; from "
                    "http://mirror/m")
    assert mw.progress_line("b300a", {}) == "b300a: no progress yet"
    assert mw.duration(3725) == "1 h 02 m" and mw.human(1536) == "1.5 KiB" and mw.human(900) == "900 B"


# --- input rules -----------------------------------------------------------------------------------------------------------
# the role's defaults, and its source, which lives in the shared home (site.yml's preflight reads it too)
DEFAULTS = dict(yaml.safe_load((ROOT / "roles/model_weights/defaults/main.yml").read_text()),
                **{k: v for k, v in yaml.safe_load((ROOT / "roles/b300_defaults/defaults/main.yml").read_text()).items()
                   if k.startswith("model_weights_")})


def test_every_default_has_a_rule_or_a_reason():
    assert set(DEFAULTS) == set(ir.MODEL_WEIGHTS_RULES) | set(ir.MODEL_WEIGHTS_NOT_CHECKED), (
        sorted(set(DEFAULTS) ^ (set(ir.MODEL_WEIGHTS_RULES) | set(ir.MODEL_WEIGHTS_NOT_CHECKED))))
    assert all(ir.MODEL_WEIGHTS_NOT_CHECKED.values())


def test_defaults_and_the_sandbox_values_pass():
    rendered = {k: v for k, v in DEFAULTS.items() if "{{" not in str(v)}
    rendered.update(model_weights_serve_address="10.89.30.11", model_weights_manifest_dir="/repo/inventory/x",
                    model_weights_group="sglang", model_weights_protect_home=True)
    assert ir.check_model_weights_inputs(rendered, "b300a") == []
    sandbox = yaml.safe_load((ROOT / "inventory/sandbox/group_vars/all.yml").read_text())
    mine = {k: v for k, v in sandbox.items() if k.startswith("model_weights_")}
    assert mine["model_weights_source"]["where"] == "controller"
    mine["model_weights_source"] = dict(mine["model_weights_source"], path="/repo/sandbox/sglang_stub/models")
    mine["model_weights_manifest_dir"] = "/repo/inventory/weights-manifests/sandbox"
    assert ir.check_model_weights_inputs(dict(rendered, **mine), "b300a") == []


@pytest.mark.parametrize("var, value, expected", [
    ("model_weights_source", {"type": "http", "url": "https://user:pw@mirror/m"}, "url carries credentials"),
    ("model_weights_source", {"type": "http", "url": "ftp://mirror/m"}, "is not an http(s) URL"),
    ("model_weights_source", {"type": "path", "path": "/srv/it's"}, "holds \"'\" at character 8"),
    ("model_weights_file_mode", 640, "an octal mode as a quoted string"),
    ("model_weights_parallel_files", 0, "out of range"),
    ("model_weights_serve_port", "31990", "is a string"),
    ("model_weights_serve_address", "127.0.0.1", "loopback"),
    ("model_weights_digests", {"m": "abc"}, "64 lower-case hex digits"),
])
def test_bad_inputs_refused(var, value, expected):
    problems = ir.check_model_weights_inputs({var: value}, "b300a")
    assert len(problems) == 1 and problems[0].startswith("b300a: %s: " % var) and expected in problems[0], problems


def test_secrets_checked_and_never_shown():
    secret = "s3cr3t-value\n"
    problems = ir.check_model_weights_secrets({"model_weights_s3_secret_access_key": secret,
                                               "model_weights_http_token": "fine-token"}, "controller")
    assert len(problems) == 1 and "line break" in problems[0] and "s3cr3t" not in problems[0]


# --- the sandbox's pinned manifests are the stub models' ------------------------------------------------------------------
@pytest.mark.parametrize("rel", ["GLM-5.2-NVFP4", "moonshotai/Kimi-K3", "RadixArk/Kimi-K3-DSpark"])
def test_sandbox_manifests_match_the_stub_models(rel, tmp_path):
    """tools/weights-manifest on sandbox/sglang_stub/models/<rel> gives the pinned file byte for byte: a change to a
    stub model without its manifest fails here (fix: tools/weights-manifest DIR -o the pinned file)."""
    pinned = ROOT / "inventory/weights-manifests/sandbox" / (rel + ".json")
    out = tmp_path / "m.json"
    subprocess.run([sys.executable, str(ROOT / "tools/weights-manifest"), str(ROOT / "sandbox/sglang_stub/models" / rel),
                    "-o", str(out)], check=True, capture_output=True)
    assert out.read_text() == pinned.read_text()
    assert set(mw.parse_manifest(pinned.read_text(), str(pinned))) == set(
        os.listdir(ROOT / "sandbox/sglang_stub/models" / rel))
