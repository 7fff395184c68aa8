"""tools/argspecs.py copies each variable's comment from defaults/main.yml into meta/argument_specs.yml, whole.

The generator reads the defaults top-down; this test reads them bottom-up from each variable (a second, independent
reading of the same rule) and asserts that every generated description is exactly its source comment: no line
dropped because it reads like `word: text`, no line of a neighbour's comment pulled in. It once said that the CUDA 13
transfer engine links libcudart.so.12 (a line "# build: sglang 0.5.17/0.5.18 are CUDA 13 stacks ..." was taken for a
commented-out variable and dropped), the opposite of the truth.
"""
import pathlib
import re

import pytest
import yaml

import argspecs

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "defaults" / "main.yml").exists())

TOP_VAR = re.compile(r"^([a-z][a-z0-9_]*):(?:\s|$)")
COMMENTED_VAR = re.compile(r"^#\s*([a-z][a-z0-9_]*):\s*\S")


def _words(text):
    return " ".join(text.split())


def _is_header(line):
    body = line.lstrip("#").strip()
    return body.startswith("---") or bool(re.match(r"^entry points?\b", body)) or bool(re.match(r"^-+ .* -+$", body))


def source_comment(lines, index, declares):
    """The comment lines directly above lines[index], read upwards until a non-comment line, a section header or a
    line that declares another (optional) variable."""
    out = []
    i = index - 1
    while i >= 0 and lines[i].startswith("#") and not _is_header(lines[i]) and not declares(lines, i):
        out.append(lines[i].lstrip("#").strip())
        i -= 1
    return _words(" ".join(reversed(out)))


def _declarer(role, lines):
    prefixes = (role + "_", role.split("_")[0] + "_", "hw_")
    defined = {m.group(1) for m in map(TOP_VAR.match, lines) if m}

    def declares(lines_, i):
        m = COMMENTED_VAR.match(lines_[i])
        above = i > 0 and lines_[i - 1].startswith("#") and not _is_header(lines_[i - 1])
        return bool(m and m.group(1).startswith(prefixes) and m.group(1) not in defined and above)
    return declares


def _main_options(role):
    spec = yaml.safe_load((ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text())
    return spec["argument_specs"]["main"]["options"]


@pytest.mark.parametrize("role", ROLES)
def test_every_generated_description_is_its_source_comment(role):
    lines = (ROOT / "roles" / role / "defaults" / "main.yml").read_text().splitlines()
    declares = _declarer(role, lines)
    options = _main_options(role)
    checked = 0
    for name, opt in options.items():
        at = [i for i, line in enumerate(lines) if TOP_VAR.match(line) and TOP_VAR.match(line).group(1) == name]
        if not at:  # an optional variable: declared by its commented-out example
            at = [i for i, line in enumerate(lines) if COMMENTED_VAR.match(line)
                  and COMMENTED_VAR.match(line).group(1) == name and declares(lines, i)]
        assert len(at) == 1, "%s: %s is neither defined nor declared once in defaults/main.yml (%s)" % (role, name, at)
        expected = source_comment(lines, at[0], declares)
        assert expected, "%s: %s has no comment above it" % (role, name)
        assert _words(opt["description"]) == expected, (
            "%s: the generated description of %s differs from its comment in defaults/main.yml\n generated: %s\n"
            " comment:   %s\nfix tools/argspecs.py, then tools/argspecs.py --write %s" % (
                role, name, _words(opt["description"]), expected, role))
        checked += 1
    assert checked == len(options) and checked > 0


@pytest.mark.parametrize("role", ROLES)
def test_every_comment_line_next_to_a_variable_is_in_a_description(role):
    """The other direction: no comment line that sits in a variable's block is missing from every description."""
    lines = (ROOT / "roles" / role / "defaults" / "main.yml").read_text().splitlines()
    text = " ".join(_words(o["description"]) for o in _main_options(role).values())
    declares = _declarer(role, lines)
    for i, line in enumerate(lines):
        if not TOP_VAR.match(line) and not declares(lines, i):
            continue
        j = i - 1
        while j >= 0 and lines[j].startswith("#") and not _is_header(lines[j]) and not declares(lines, j):
            body = _words(lines[j].lstrip("#"))
            assert body in text, "%s: comment line %d (%r) is in no generated description" % (role, j + 1, lines[j])
            j -= 1


def _generate(tmp_path, defaults):
    role = tmp_path / "demo"
    (role / "defaults").mkdir(parents=True)
    head = "---\n# entry point main: Run the demo and wait for it.\n# The demo role: a demo.\n\n"
    (role / "defaults" / "main.yml").write_text(head + defaults.removeprefix("---\n"))
    return argspecs.generate(role)["options"]


def test_lines_that_read_like_a_key_stay_in_the_description(tmp_path):
    opts = _generate(tmp_path, "---\n"
                     "# The transfer engine package. The CUDA 13\n"
                     "# build: sglang 0.5.17/0.5.18 are CUDA 13 stacks, and the plain\n"
                     "# wheel links libcudart.so.12.\n"
                     "demo_package: engine-cuda13\n"
                     "# Flag set: resilient (retries, breaker and health\n"
                     "# checks: 0 failed requests) or seed.\n"
                     "demo_flags: resilient\n")
    assert opts["demo_package"]["description"] == (
        "The transfer engine package. The CUDA 13 build: sglang 0.5.17/0.5.18 are CUDA 13 stacks, and the plain wheel "
        "links libcudart.so.12.")
    assert opts["demo_flags"]["description"] == "Flag set: resilient (retries, breaker and health checks: 0 failed " \
                                                "requests) or seed."


def test_a_commented_out_example_ends_its_block(tmp_path):
    """The optional variable's comment belongs to it, not to the variable defined after it."""
    opts = _generate(tmp_path, "---\n"
                     "# Per host: address peers use.\n"
                     "# demo_addr: 10.0.0.11\n"
                     "# Optional key. Empty: none.\n"
                     "demo_key: \"\"\n")
    assert opts["demo_key"]["description"] == "Optional key. Empty: none."
    assert opts["demo_addr"] == {"type": "str", "description": "Per host: address peers use."}


def test_a_keylike_line_without_the_role_prefix_declares_nothing(tmp_path):
    opts = _generate(tmp_path,
                     "---\n# Rows. Example:\n#   source: \"run 2026-03\"\n#   driver: {a: 1}\ndemo_rows: []\n")
    assert set(opts) == {"demo_rows"}
    assert opts["demo_rows"]["description"] == 'Rows. Example: source: "run 2026-03" driver: {a: 1}'


def test_the_mooncake_description_says_the_cuda13_build_is_the_one_installed():
    desc = _words(_main_options("sglang")["sglang_mooncake_package"]["description"])
    assert "The CUDA 13 build: sglang 0.5.17/0.5.18 are CUDA 13 stacks" in desc
    assert "the plain `mooncake-transfer-engine` wheel links libcudart.so.12" in desc
    assert "CUDA 13 `mooncake-transfer-engine` wheel links libcudart.so.12" not in desc
