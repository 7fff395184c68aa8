"""`make plan` at unit level: module_utils/sglang/sglang_plan.py's reading of rendered units, and the role's real templates
rendered in-process through the same lookup the preflight uses (roles/sglang/templates/plan_rendered.json.j2).

The rendered-template tests are the cheap half of the check that the plan shows what the deploy writes: the argv
systemd makes of the rendered ExecStart= line must be exactly the planner's argv, and the env file exactly the
planner's env. tests/integration/test_plan.py compares the plan with the unit files a deploy wrote on the sandbox.
The facts are SYNTHESIZED (test_sglang_plan.synth_b300_facts).
"""
import json
import pathlib
import subprocess
import sys

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.filter import sglang_plan as plan_filters
from ansible_collections.b300.rollout.plugins.module_utils.sglang import sglang_plan as sp
from test_sglang_plan import hosts, plan

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "sglang"
KEY = 'not-a-real-key"with\\quote$'


# ---------- systemd's reading of an ExecStart= line ----------

ARGVS = [
    ["/opt/sglang/0.5.17/bin/sglang", "serve", "--model-path", "/models/GLM-5.2-NVFP4", "--enable-metrics"],
    ["/bin/x", "a b", 'say "hi"', "back\\slash", "100%", "$HOME", "${SGLANG_API_KEY}x", "", "tab\there"],
    ["/bin/x", "--json-model-override-args", '{"rope_scaling": {"type": "yarn", "factor": 4.0}}'],
]


@pytest.mark.parametrize("argv", ARGVS)
def test_split_exec_line_reads_back_what_exec_start_line_wrote(argv):
    prefix, back = sp.split_exec_line(sp.exec_start_line(argv))
    assert (prefix, back) == ("", argv)


def test_split_exec_line_prefix_bare_words_and_the_key_token():
    assert sp.split_exec_line("+/opt/hwemu/bin/nvidia-modprobe -u -c=0") == (
        "+", ["/opt/hwemu/bin/nvidia-modprobe", "-u", "-c=0"])
    assert sp.split_exec_line("-@/bin/a  'single quoted'  x") == ("-@", ["/bin/a", "single quoted", "x"])
    # the launcher form: $$ in the unit is a literal $ for the program (systemd does not expand it)
    line = '/usr/bin/python3 /l/sglang_launch.py "/s" "serve" "--api-key" "$${SGLANG_API_KEY}"'
    assert sp.split_exec_line(line)[1][-2:] == ["--api-key", "${SGLANG_API_KEY}"]


# ---------- secrets ----------

@pytest.mark.parametrize("line,shown", [
    ('SGLANG_API_KEY="abc\\"def"', 'SGLANG_API_KEY="<masked>"'),
    ("HF_TOKEN=hf_abc", "HF_TOKEN=<masked>"),
    ("DB_PASSWORD=x y z", "DB_PASSWORD=<masked>"),
    ("SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK=8", "SGLANG_OPT_DEEPGEMM_MEGA_MOE_NUM_MAX_TOKENS_PER_RANK=8"),
    ("MC_FORCE_HCA=1", "MC_FORCE_HCA=1"),
    ("KEYBOARD=us", "KEYBOARD=us"),
])
def test_env_file_lines_mask_secret_values_only(line, shown):
    assert sp.env_lines_shown("# comment\n\n" + line + "\n") == [shown]


def test_unit_lines_keep_order_drop_other_keys_and_mask():
    unit = "\n".join([
        "# ExecStart=/commented/out",
        "[Service]",
        "User=sglang",
        'Environment=HOME=/var/lib/sglang HF_TOKEN=hf_x OTHER="a b" API_KEY="q r"',
        "EnvironmentFile=/etc/sglang/p0.env",
        "ExecStartPre=+/usr/bin/nvidia-modprobe -u -c=0",
        'ExecStart="/s" "serve" "--api-key" "plain-secret" "--admin-api-key=other" "--port" "1"',
        "ExecStartPost=/bin/true",
        "Restart=on-failure",
    ])
    lines = sp.unit_lines_shown(unit)
    assert [line.split("=", 1)[0] for line in lines] == ["Environment", "EnvironmentFile", "ExecStartPre", "ExecStart"]
    assert lines[0] == 'Environment=HOME=/var/lib/sglang HF_TOKEN=<masked> OTHER="a b" API_KEY="<masked>"'
    assert "plain-secret" not in lines[3] and "other" not in lines[3]
    assert sp.split_exec_line(lines[3][len("ExecStart="):])[1] == [
        "/s", "serve", "--api-key", "<masked>", "--admin-api-key=<masked>", "--port", "1"]
    # the key's ${VAR} reference is not a secret: kept as the unit has it
    token = 'ExecStart="/s" "--api-key" "$${SGLANG_API_KEY}"'
    assert sp.unit_lines_shown(token) == [token]


def test_argv_display_one_flag_per_line():
    argv = ["/py", "-m", "sglang_router.launch_router", "--pd-disaggregation", "--prefill", "http://a:1", "8998",
            "--decode", "http://b:2", "--x", "two words"]
    assert sp.argv_display(argv, indent="") == [
        "/py -m sglang_router.launch_router", "  --pd-disaggregation", "  --prefill http://a:1 8998",
        "  --decode http://b:2", "  --x 'two words'"]


def test_filter_refuses_an_unknown_kind():
    with pytest.raises(Exception, match="is not instance, router or front"):
        plan_filters.sglang_plan_views([{"kind": "worker", "plan": {}, "unit": "", "env": ""}])


# ---------- the role's templates, rendered as the preflight renders them ----------

# Run in a separate interpreter: Ansible's plugin loader installs a collection finder for the whole process, after
# which the other unit tests' plain imports of ansible_collections.b300.rollout.* fail.
RENDER = r"""
import json, pathlib, sys
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader, lookup_loader
from ansible.template import Templar, trust_as_template

role, collections = pathlib.Path(sys.argv[1]), sys.argv[2]
init_plugin_loader([collections])


def trusted(value):  # role defaults/vars as Ansible loads them: strings are templates
    if isinstance(value, str):
        return trust_as_template(value)
    if isinstance(value, dict):
        return {k: trusted(v) for k, v in value.items()}
    if isinstance(value, list):
        return [trusted(v) for v in value]
    return value


base = {}
base.update(trusted(yaml.safe_load((role / "defaults" / "main.yml").read_text())))
base.update(trusted(yaml.safe_load((role / "vars" / "main.yml").read_text())))
out = []
for case in json.load(sys.stdin):
    variables = dict(base, **case, ansible_search_path=[str(role)])
    loader = DataLoader()
    lookup = lookup_loader.get("ansible.builtin.template", loader=loader,
                               templar=Templar(loader=loader, variables=variables))
    out.append(json.loads(lookup.run(["plan_rendered.json.j2"], variables=variables)[0]))
json.dump(out, sys.stdout)
"""


def render_hosts(cases):
    """For each (plan, host, api_key): what plan.yml's "Validate | this host's units as they will be written"
    computes, the lookup of roles/sglang/templates/plan_rendered.json.j2 with the role's defaults and vars (in one
    separate interpreter for all cases), then the sglang_plan_views filter."""
    payload = []
    for the_plan, host, api_key in cases:
        module_result = dict(the_plan, exec_start={i["id"]: sp.exec_start_line(i["argv"]) for i in the_plan["instances"]})
        module_result["exec_start"]["router"] = sp.exec_start_line(the_plan["router"]["argv"])
        payload.append({"sglang_plan": module_result, "inventory_hostname": host, "sglang_api_key": api_key,
                        "sglang_host_instances": [i for i in the_plan["instances"] if i["host"] == host]})
    r = subprocess.run([sys.executable, "-c", RENDER, str(ROLE), str(ROOT / "collections")], input=json.dumps(payload),
                       capture_output=True, text=True, timeout=120, check=False, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-4000:]
    return [plan_filters.sglang_plan_views(rendered) for rendered in json.loads(r.stdout)]


def _plan_with_key(profile, api_key):
    version = {"glm52_pd": "0.5.17", "kimi_k3": "0.5.18"}[profile]
    return plan(profile, api_key_enabled=bool(api_key), sglang_version=version, router_version="0.3.2")


CASES = [(profile, api_key) for profile in ("glm52_pd", "kimi_k3") for api_key in ("", KEY)]


@pytest.fixture(scope="module")
def rendered():
    """{(profile, api_key): (plan, {host: views})} for both profiles with and without a key, rendered at once."""
    plans = {case: _plan_with_key(*case) for case in CASES}
    jobs = [(case, host) for case in CASES for host in ("b300a", "b300b")]
    views = render_hosts([(plans[case], host, case[1]) for case, host in jobs])
    out = {case: (plans[case], {}) for case in CASES}
    for (case, host), host_views in zip(jobs, views):
        out[case][1][host] = host_views
    return out


@pytest.mark.parametrize("api_key", ["", KEY], ids=["no-key", "key"])
@pytest.mark.parametrize("profile", ["glm52_pd", "kimi_k3"])
def test_plan_of_the_rendered_units_is_the_planners_argv_and_env(rendered, profile, api_key):
    the_plan, by_host = rendered[(profile, api_key)]
    assert the_plan["errors"] == []
    views = []
    for host, host_views in sorted(by_host.items()):
        assert [v["id"] for v in host_views] == (
            [i["id"] for i in the_plan["instances"] if i["host"] == host]
            + (["b300a/router"] if host == the_plan["router"]["host"] else []))
        views += host_views
    planned = {i["id"]: i for i in the_plan["instances"]}
    launcher = ["/usr/bin/python3", "/usr/local/lib/sglang-launch/sglang_launch.py"] if api_key else []
    for view in views:
        entry = the_plan["router"] if view["kind"] == "router" else planned[view["id"]]
        # the argv systemd makes of the rendered ExecStart= line is the planner's (the key only as ${SGLANG_API_KEY})
        assert view["argv"] == launcher + entry["argv"], view["id"]
        assert ("--api-key" in entry["argv"]) == bool(api_key)
        assert [line.split("=", 1)[0] for line in view["unit_lines"]].count("ExecStart") == 1
        assert "EnvironmentFile=%s" % entry["env_file"] in view["unit_lines"]
        # the env file carries the planner's env, in its order (lines the template adds itself are shown as well)
        assert ('SGLANG_API_KEY="<masked>"' in view["env_lines"]) == bool(api_key)
        if view["kind"] == "instance":
            planned_env = ["%s=%s" % kv for kv in entry["env"].items()]
            assert [line for line in view["env_lines"] if line in planned_env] == planned_env, view["id"]
            assert [view[k] for k in ("gpus", "port", "ib_devices")] == [entry[k] for k in ("gpus", "port", "ib_devices")]
    text = plan_filters.sglang_plan_text(views)
    assert KEY not in text and "not-a-real-key" not in text
    assert text.count('SGLANG_API_KEY="<masked>"') == (len(views) if api_key else 0)
    # the whole plan is the hosts' texts one after the other (make plan == every host's preflight text)
    a = [v for v in views if v["host"] == "b300a"]
    b = [v for v in views if v["host"] == "b300b"]
    assert text == plan_filters.sglang_plan_text(a) + sp.PLAN_SEPARATOR + plan_filters.sglang_plan_text(b)


def test_text_of_a_pd_prefill_names_gpus_ports_rdma_and_the_exact_line(rendered):
    the_plan, by_host = rendered[("glm52_pd", "")]
    p0 = next(i for i in the_plan["instances"] if i["name"] == "P0")
    text = plan_filters.sglang_plan_text(by_host["b300a"])
    block = text.split(sp.PLAN_SEPARATOR)[0]
    assert block.splitlines()[0] == (
        "b300a P0 (prefill, profile glm52_pd, sglang 0.5.17): GPUs 0,1,2,3, port 30001, nccl port 31701, "
        "bootstrap port 8998, RDMA mlx5_0,mlx5_1,mlx5_2,mlx5_3, URL http://10.89.30.11:30001")
    assert "    ExecStart=" + sp.exec_start_line(p0["argv"]) in block.splitlines()
    assert "      --disaggregation-ib-device mlx5_0,mlx5_1,mlx5_2,mlx5_3" in block.splitlines()
    assert "    NCCL_NVLS_ENABLE=0" in block.splitlines()


def test_hosts_helper_matches_the_sandbox_groups():
    """The unit-level plan uses the sandbox's group layout (router and prefill on b300a, decode on b300b)."""
    inv = yaml.safe_load((ROOT / "inventory" / "sandbox" / "hosts.yml").read_text())["all"]["children"]
    for h in hosts("glm52_pd"):
        member_of = sorted(g for g, spec in inv.items() if h["name"] in (spec.get("hosts") or {}))
        assert member_of == sorted(h["groups"]), h["name"]
