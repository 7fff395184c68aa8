"""module_utils/common/input_rules.py: the value rules preflight runs on every input before anything changes (issue 23).

Three kinds of tests:
- coverage: every variable of roles/sglang/defaults/main.yml has a rule (or a written reason why not), and the values
  the project ships (defaults, the sandbox settings, the production inventory, both profiles) pass;
- the unit-level bad-input table (CASES): one value per row, the variable and a fragment of the rule/fix expected in
  the refusal; every refusal names the variable, the rule and the fix, and never shows a secret;
- rules, not lists: generated values (random Bearer tokens; every character class in every position of a key, a
  path, an env value) are judged by their class, and legal values that need care (a model path with a space, % and $,
  an env value with a space and %) pass.
The end-to-end layer is tests/integration/test_bad_input.py (controller-side preflight runs and sandbox runs).
"""
import random
import string
import unicodedata

import pytest
import yaml

from ansible_collections.b300.rollout.plugins.module_utils.common import input_rules as ir

from conftest import ROOT

DEFAULTS = yaml.safe_load((ROOT / "roles" / "sglang" / "defaults" / "main.yml").read_text())
KEY = "sk-b300-" + "0123456789abcdef" * 2          # a legal key (40 characters of the token alphabet)


def rendered_defaults():
    """The defaults as Ansible renders them (two are Jinja references to other defaults)."""
    d = dict(DEFAULTS)
    d["sglang_server_executable"] = "/opt/sglang/{version}/bin/sglang"
    d["sglang_router_user"], d["sglang_router_group"] = d["sglang_user"], d["sglang_group"]
    return d


def refusals(var, value, **more):
    values = dict(rendered_defaults(), **{var: value}, **more)
    return ir.check_role_inputs(values, host="b300a")


# --- coverage: every role variable has a rule; what the project ships passes ----------------------------------------
def test_every_default_variable_has_a_rule_or_a_reason():
    assert set(DEFAULTS) == set(ir.ROLE_RULES) | set(ir.NOT_CHECKED), (
        "new role variables without a value rule: %s; rules for variables that are gone: %s"
        % (sorted(set(DEFAULTS) - set(ir.ROLE_RULES) - set(ir.NOT_CHECKED)),
           sorted((set(ir.ROLE_RULES) | set(ir.NOT_CHECKED)) - set(DEFAULTS))))
    assert all(ir.NOT_CHECKED.values())


def test_defaults_sandbox_and_production_values_pass():
    assert ir.check_role_inputs(rendered_defaults(), "b300a") == []
    # the sandbox's settings (one file: inventory/sandbox/group_vars/all.yml); its templated values as they render
    sandbox = yaml.safe_load((ROOT / "inventory" / "sandbox" / "group_vars" / "all.yml").read_text())
    sandbox = {k: v for k, v in sandbox.items() if k in ir.ROLE_RULES}
    assert len(sandbox) >= 15, sorted(sandbox)
    sandbox["sglang_wheelhouse_dir"] = str(ROOT / ".cache" / "wheelhouse")
    sandbox["sglang_advertise_address"] = "10.89.30.11"
    assert ir.check_role_inputs(dict(rendered_defaults(), **sandbox), "b300a") == []
    prod = yaml.safe_load((ROOT / "inventory" / "production" / "group_vars" / "all.yml").read_text())
    prod = {k: v for k, v in prod.items() if k in ir.ROLE_RULES and "CHANGE_ME" not in str(v) and "{{" not in str(v)}
    assert prod and ir.check_role_inputs(dict(rendered_defaults(), **prod), "b300a") == []


# the scenarios that deploy SGLang (molecule/sglang_*): their host values are the role's inputs (host_stack's are not)
@pytest.mark.parametrize("path", sorted((ROOT / "molecule").glob("sglang_*/host_vars/*.yml")), ids=lambda p: p.stem)
def test_molecule_host_values_pass(path):
    """The scenarios' own host values (file:/// wheelhouse URL among them) pass the rules the role's preflight runs:
    a rule tightened past them fails here in seconds, not in molecule at the end of CI (it did once)."""
    hvars = {k: v for k, v in yaml.safe_load(path.read_text()).items()
             if k in ir.ROLE_RULES and "{{" not in str(v)}
    assert hvars, path
    assert ir.check_role_inputs(dict(rendered_defaults(), **hvars), "b300a") == []


@pytest.mark.parametrize("name", ["kimi_k3", "glm52_pd"])
def test_profiles_pass(name):
    data = yaml.safe_load((ROOT / "roles" / "sglang" / "files" / "profiles" / ("%s.yml" % name)).read_text())
    assert ir.check_profile_data(data, "profile " + name) == []


# --- the unit-level bad-input table ---------------------------------------------------------------------------------
C = pytest.param
CASES = [
    # secrets (value never shown)
    C("sglang_api_key", KEY + "\n", "line break (newline) at character 41", id="key_trailing_newline"),
    C("sglang_api_key", "                    ", "a space at character 1", id="key_only_spaces"),
    C("sglang_api_key", "sk-b300 0123456789abcdef", "a space at character 8", id="key_inner_space"),
    C("sglang_api_key", "clé-secrète-0123456789", "a non-ASCII character at character 3", id="key_non_ascii"),
    C("sglang_api_key", "\tsk-b3000123456789abcdef", "a tab at character 1", id="key_tab"),
    C("sglang_api_key", "sk-b300\x000123456789abcdef", "control character (U+0000)", id="key_nul"),
    C("sglang_api_key", "sk-b300;0123456789abcdef", "outside the token alphabet at character 8", id="key_semicolon"),
    C("sglang_api_key", "sk=b300-0123456789abcdef", "'=' is padding, allowed only at the end", id="key_inner_equals"),
    C("sglang_api_key", "short-key", "too short", id="key_too_short"),
    C("sglang_api_key", "k" * 300, "too long", id="key_too_long"),
    C("sglang_api_key", 12345678901234567890, "a number, not a string", id="key_yaml_number"),
    # paths into argv (quoted) and into unit files (unquoted)
    C("sglang_model_root", "models", "is not an absolute path", id="model_root_relative"),
    C("sglang_model_root", "", "empty", id="model_root_empty"),
    C("sglang_model_root", None, "empty", id="model_root_null"),
    C("sglang_model_root", "/models\n", "leading or trailing whitespace", id="model_root_newline"),
    C("sglang_model_root", "/models/../etc", "write it as /etc", id="model_root_dotdot"),
    C("sglang_model_root", '/mod"els', "holds '\"' at character 5", id="model_root_quote"),
    C("sglang_model_root", "/modèles", "a non-ASCII character at character 5", id="model_root_non_ascii"),
    C("sglang_env_dir", "/etc/sglang env", "a space at character 12", id="env_dir_space"),
    C("sglang_env_dir", "/etc/sglang-%i", "holds '%' at character 13", id="env_dir_specifier"),
    C("sglang_install_root", "/opt/$SGLANG", "holds '$' at character 6", id="install_root_dollar"),
    C("sglang_state_dir", "/srv/sglang", "is not a directory directly under /var/lib", id="state_dir_not_var_lib"),
    C("sglang_launcher_python", "/usr/bin/python3 -I", "a space at character 17", id="launcher_python_args"),
    # names
    C("sglang_unit_prefix", "sglang prod", "is not letters, digits", id="unit_prefix_space"),
    C("sglang_unit_prefix", "sglang@x", "is not letters, digits", id="unit_prefix_template_char"),
    C("sglang_profile", "../kimi_k3", "is not lower-case letters", id="profile_traversal"),
    C("sglang_user", "root", "never run as root", id="user_root"),
    C("sglang_user", "SGLang", "is not a POSIX user/group name", id="user_upper_case"),
    C("sglang_group", "", "empty", id="group_empty"),
    C("sglang_gpu_boot_services", ["nvidia-persistenced"], "item 1", id="boot_service_without_suffix"),
    C("sglang_supplementary_groups", ["video render"], "item 1", id="groups_space_in_item"),
    # addresses
    C("sglang_bind_host", "localhost", "is not an IP address", id="bind_host_name"),
    C("sglang_router_bind_host", "0.0.0.0:30080", "is not an IP address", id="router_bind_with_port"),
    C("sglang_router_prometheus_host", "127.0.0.1 ", "is not an IP address", id="prometheus_host_trailing_space"),
    # numbers and booleans given as strings
    C("sglang_health_timeout_s", "3600s", "is not a whole number", id="timeout_with_unit"),
    C("sglang_health_timeout_s", "-5", "is not a whole number", id="timeout_negative_string"),
    C("sglang_health_timeout_s", 0, "is out of range", id="timeout_zero"),
    C("sglang_router_smoke_requests", "4.0", "is not a whole number", id="count_decimal_string"),
    C("sglang_stop_timeout_s", True, "a boolean True is not a whole number", id="timeout_yaml_bool"),
    C("sglang_model_check", "flase", "would silently mean false", id="bool_typo"),
    C("sglang_router_smoke", "", "is not a boolean", id="bool_empty_string"),
    C("sglang_pip_no_deps", 2, "is not a boolean", id="bool_number"),
    # text, urls, sizes (choices: the argument spec, test_a_choice_left_to_the_spec_is_one)
    C("sglang_generate_prompt", "Say\nhello", "line break (newline)", id="prompt_newline"),
    C("sglang_wheelhouse_url", "https://ops:hunter2@wheels.internal/", "credentials", id="url_with_password"),
    C("sglang_wheelhouse_url", "ftp://wheels.internal/", "is neither an http(s) URL", id="url_scheme"),
    C("sglang_wheelhouse_url", "file://opt/wheels", "nor file:///ABSOLUTE/DIR", id="url_file_relative"),
    C("sglang_wheelhouse_url", "file:///opt/wheel house", "a space", id="url_file_space"),
    C("sglang_limit_memlock", "unlimited", "is not a size", id="memlock_word"),
    C("sglang_mooncake_version", ">=0.3", "is not an exact version", id="mooncake_range"),
    C("sglang_unit_environment", {"HF_HUB_OFFLINE": "1 2"}, "a space at character 2", id="unit_env_space"),
    C("sglang_unit_environment", {"HF_HOME": "/var/cache/%n"}, "'%' at character 12", id="unit_env_specifier"),
]


@pytest.mark.parametrize("var,value,fragment", CASES)
def test_bad_value_refused_naming_variable_rule_and_fix(var, value, fragment):
    problems = refusals(var, value)
    assert len(problems) == 1, problems
    msg = problems[0]
    assert msg.startswith("b300a: %s: " % var), msg
    assert fragment in msg, msg
    assert "; rule: " in msg and "; fix: " in msg, msg
    if var in ir.SECRET_VARS and isinstance(value, str) and value.strip():
        assert value not in msg and value.strip() not in msg, "the secret is in the message: %s" % msg
        assert "value not shown" in msg


def test_table_size_and_classes():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and len(CASES) >= 40
    classes = {i.split("_")[0] for i in ids}
    assert {"key", "model", "env", "unit", "user", "bind", "timeout", "bool", "url"} <= classes


NESTED = [
    C({"sglang_server_extra_env": {"NCCL_DEBUG": "WARN\nEXTRA=1"}}, "sglang_server_extra_env.NCCL_DEBUG",
      "line break", id="extra_env_newline"),
    C({"sglang_server_extra_env": {"NCCL DEBUG": "WARN"}}, "sglang_server_extra_env.NCCL DEBUG",
      "not an environment variable name", id="extra_env_bad_name"),
    C({"sglang_server_extra_env": {"X": '"quoted"'}}, "sglang_server_extra_env.X", "holds '\"'",
      id="extra_env_quote"),
    C({"sglang_server_extra_env": {"X": "$HOME/x"}}, "sglang_server_extra_env.X", "holds '$'", id="extra_env_dollar"),
    C({"sglang_server_extra_args": {"--served-model-name": "kimi\nExecStartPost=/bin/sh"}},
      "sglang_server_extra_args[--served-model-name]", "a newline would end the ExecStart= line",
      id="extra_arg_newline_injection"),
    C({"sglang_server_extra_args": {"--log-level info": True}}, "sglang_server_extra_args[--log-level info]",
      "is not a long option", id="extra_arg_flag_with_space"),
    C({"sglang_router_extra_args": {"--policy": " round_robin"}}, "sglang_router_extra_args[--policy]",
      "leading or trailing whitespace", id="router_arg_whitespace"),
    C({"sglang_profile_overrides": {"router": {"port": "30080"}}}, "sglang_profile_overrides.router.port",
      "write it without quotes: 30080", id="override_port_string"),
    C({"sglang_profile_overrides": {"roles": {"worker": {"port_base": 70000}}}},
      "sglang_profile_overrides.roles.worker.port_base", "70000 is out of range", id="override_port_range"),
    C({"sglang_health_poll_s": 120, "sglang_health_timeout_s": "60"}, "sglang_health_poll_s",
      "120 is larger than sglang_health_timeout_s 60", id="poll_longer_than_timeout"),
    C({"sglang_fabric_wait_timeout_s": 1800}, "sglang_fabric_wait_timeout_s",
      "1800 is not below sglang_start_timeout_s 1800", id="fabric_wait_not_below_start_timeout"),
]


@pytest.mark.parametrize("values,label,fragment", NESTED)
def test_nested_and_related_values_refused(values, label, fragment):
    problems = ir.check_role_inputs(dict(rendered_defaults(), **values), host="b300b")
    assert len(problems) == 1, problems
    assert problems[0].startswith("b300b: %s: " % label) and fragment in problems[0], problems
    assert "; rule: " in problems[0] and "; fix: " in problems[0]


HOST = [
    C({"sglang_advertise_address": "127.0.0.1"}, "sglang_advertise_address", "loopback", id="advertise_loopback"),
    C({"sglang_advertise_address": "0.0.0.0"}, "sglang_advertise_address", "unspecified", id="advertise_any"),
    C({"sglang_advertise_address": "10.0.0.11/24"}, "sglang_advertise_address", "neither an IP address nor a DNS",
      id="advertise_cidr"),
    C({"sglang_advertise_address": "10.0.0.300"}, "sglang_advertise_address", "neither", id="advertise_bad_octet"),
    C({"sglang_instance_overrides": {"W0": {"port": "30001"}}}, "sglang_instance_overrides.W0.port",
      "is a string", id="override_port_as_string"),
    C({"sglang_instance_overrides": {"W0": {"gpus": ["0", "1"]}}}, "sglang_instance_overrides.W0.gpus",
      "holds strings", id="override_gpus_as_strings"),
    C({"sglang_instance_overrides": {"W0": {"prot": 30001}}}, "sglang_instance_overrides.W0.prot",
      "unknown key 'prot'", id="override_key_typo"),
    C({"sglang_instance_overrides": {"P0": {"ib_devices": ["mlx5_0 mlx5_1"]}}},
      "sglang_instance_overrides.P0.ib_devices", "is not an RDMA device name", id="override_ib_device_space"),
]


@pytest.mark.parametrize("hvars,label,fragment", HOST)
def test_host_values_refused(hvars, label, fragment):
    problems = ir.check_host_inputs("b300a", hvars)
    assert len(problems) == 1, problems
    assert problems[0].startswith("b300a: %s: " % label) and fragment in problems[0], problems


def test_unit_level_table_has_at_least_40_cases_across_classes():
    assert len(CASES) + len(NESTED) + len(HOST) >= 60


# --- rules, not lists -------------------------------------------------------------------------------------------------
def test_random_bearer_tokens_pass_and_any_foreign_character_is_refused():
    rng = random.Random(23)
    alphabet = sorted(ir.TOKEN68_CHARS)
    foreign = [c for c in (string.printable + "\x00\x1b\x7f\u00a0\u200b\u00e9\u2028\uff21") if c not in ir.TOKEN68_CHARS
               and c != "="]
    for _ in range(300):
        key = "".join(rng.choice(alphabet) for _ in range(rng.randint(16, 256)))
        key += "=" * rng.randint(0, 2) if len(key) <= 254 else ""
        assert ir.check_secret("sglang_api_key", key) == [], key
        bad_char = rng.choice(foreign)
        pos = rng.randrange(len(key))
        bad = key[:pos] + bad_char + key[pos + 1:]
        problems = ir.check_secret("sglang_api_key", bad, host="h")
        assert len(problems) == 1 and "character %d" % (pos + 1) in problems[0], (repr(bad_char), pos, problems)
        assert bad not in problems[0] and key[:12] not in problems[0]


@pytest.mark.parametrize("path", ["/models with space", "/data/50%/models", "/models/$version", "/m/{port}",
                                  "/models/kimi-k3_v2+fp8@2025", "/"])
def test_legal_argv_paths_that_need_care_pass(path):
    assert refusals("sglang_model_root", path) == []


def test_every_ascii_control_and_quote_is_refused_in_every_path_kind():
    for ch in [chr(c) for c in range(32)] + ["\x7f", '"', "'", "\\", "`"]:
        for var in ("sglang_model_root", "sglang_env_dir", "sglang_server_executable"):
            assert refusals(var, "/models/a%sb" % ch), (var, repr(ch))
    for ch in " %$!&*()[]{}=;:,?<>|#~":
        assert refusals("sglang_env_dir", "/etc/a%sb" % ch), repr(ch)        # unquoted in unit files


def test_env_values_legal_with_space_and_percent_refused_with_syntax_characters():
    ok = {"NCCL_DEBUG_SUBSYS": "INIT,NET", "SGLANG_STUB_INSTANCE_NAME": "w0 on 50% load", "PYTORCH_CUDA_ALLOC_CONF":
          "expandable_segments:True", "N": 8}
    assert ir.check_role_inputs({"sglang_server_extra_env": ok}) == []
    for ch in "\"'\\$`\n\t\r\x00":
        assert ir.check_role_inputs({"sglang_server_extra_env": {"X": "a%sb" % ch}}), repr(ch)


def test_secret_looking_env_values_are_not_shown():
    problems = ir.check_role_inputs({"sglang_server_extra_env": {"HF_TOKEN": "hf_abc\"def-123456"}})
    assert len(problems) == 1 and "hf_abc" not in problems[0] and "value not shown" in problems[0], problems


def test_non_ascii_is_refused_in_paths_and_names_but_printable_unicode_passes_in_text():
    for ch in "éß日\u00a0":
        assert refusals("sglang_model_root", "/models/x%s" % ch)
        assert refusals("sglang_unit_prefix", "sglang%s" % ch)
    assert refusals("sglang_generate_prompt", "Sag hallo, schön.") == []
    assert refusals("sglang_generate_prompt", "zero\u200bwidth")      # an invisible format character


def test_whole_numbers_and_booleans_given_as_strings():
    for good in ("30", 30, "0030"):
        assert refusals("sglang_stop_timeout_s", good) == [], good
    for bad in ("30 ", "+30", "30.0", "3e1", "0x1e", "thirty", "", None, [30], 30.5, False):
        assert refusals("sglang_stop_timeout_s", bad), bad
    for good in (True, False, "true", "False", "yes", "no", "on", "off", "1", "0"):
        assert refusals("sglang_model_check", good) == [], good
    for bad in ("ture", "enabled", " true", "", None, 1.0, [], "2"):
        assert refusals("sglang_model_check", bad), bad


def test_char_class_never_returns_the_character_for_non_ascii():
    for ch in "é日\u200b\u2028":
        assert ch not in (ir.char_class(ch) or "")
        assert unicodedata.name(ch, "") not in (ir.char_class(ch) or "x")


def test_a_choice_left_to_the_spec_is_one():
    """A variable the input rules leave to the argument spec (issue 39) has its `choices` there, so Ansible refuses a
    value outside them at the role's entry points (the message names the variable, the value and the choices)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    for role, names in (("sglang", [n for n, why in ir.NOT_CHECKED.items() if why == ir.SPEC_CHOICES]),
                        ("model_weights", [n for n, why in ir.MODEL_WEIGHTS_NOT_CHECKED.items()
                                           if why == ir.SPEC_CHOICES])):
        spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
        options = spec["argument_specs"]["main"]["options"]
        assert names
        for name in names:
            assert options[name].get("choices"), "%s: %s has no choices in its spec" % (role, name)
            errors = ArgumentSpecValidator({name: options[name]}).validate({name: "no-such-choice"}).error_messages
            assert errors == ["value of %s must be one of: %s, got: no-such-choice"
                              % (name, ", ".join(map(str, options[name]["choices"])))], errors
