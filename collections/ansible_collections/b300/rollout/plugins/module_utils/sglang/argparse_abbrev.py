# -*- coding: utf-8 -*-
"""argparse's prefix rule for long options (allow_abbrev=True, the default): the one copy used by the planner,
the SGLang stub, the role's argv check and tools/sglang_argcheck. Standard library only, no Ansible imports, so the
stub and the argv check can load this file on hosts without the collection (fleet.sh ships it next to the stub;
roles/sglang/files/sglang_argv_check.py carries a checked copy between markers, see tests/unit/test_layout.py).

`--tp 4` is accepted by `sglang serve` as `--tp-size 4` because `--tp` is the prefix of exactly one option; a prefix of
several options is refused by argparse as ambiguous; an exact option name is never an abbreviation.
"""
from __future__ import absolute_import, division, print_function
__metaclass__ = type


def prefix_matches(name, options):
    """Options (sorted) that start with `name`, e.g. --tp -> [--tp-size]."""
    return sorted(o for o in options if o.startswith(name))


def expand(name, options):
    """The long option argparse would take `name` for: None when `name` is an option itself, or no unique prefix."""
    if name in options or not name.startswith("--") or len(name) < 3:
        return None
    matches = prefix_matches(name, options)
    return matches[0] if len(matches) == 1 else None


def abbreviations(argv, options):
    """[{"used": "--tp", "long": "--tp-size"}] for each abbreviated option in argv (up to a bare --)."""
    found = []
    for tok in argv:
        if tok == "--":
            break
        name = tok.split("=", 1)[0]
        long_name = expand(name, options)
        if long_name:
            found.append({"used": name, "long": long_name})
    return found


def long_names(argv, options):
    """argv with every abbreviated option written out (`--tp=4` -> `--tp-size=4`)."""
    out = []
    for tok in argv:
        name = tok.split("=", 1)[0]
        long_name = expand(name, options)
        out.append(long_name + tok[len(name):] if long_name else tok)
    return out
