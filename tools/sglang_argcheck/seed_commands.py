"""The `sglang serve` command lines of the seed mission doc, as argv lists (for parser tests).

Read from ../shared/seeds/000_41a8a3efb3bcc347.txt at test time when present, else from the in-repository extract
tests/fixtures/seed/000_41a8a3efb3bcc347-commands.txt (the seed's five command blocks only, unchanged; a unit test
checks the extract against the seed wherever the seed exists). Placeholders are filled the way an
operator would: `<model-root>` -> /models, `<P0: a ｜ P1: b>` -> a (first instance), `<rdma-device-list>` ->
mlx5_0,mlx5_1. The SGLang version per model comes from the seed's table: GLM-5.2 on 0.5.17, Kimi-K3 on 0.5.18.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "collections"))
from ansible_collections.b300.rollout.plugins.module_utils.sglang import argparse_abbrev

SEED_NAME = "000_41a8a3efb3bcc347.txt"
EXTRACT = os.path.join("tests", "fixtures", "seed", "000_41a8a3efb3bcc347-commands.txt")
VERSION_BY_MODEL = {"GLM-5.2-NVFP4": "0.5.17", "Kimi-K3": "0.5.18"}
_ALT = re.compile(r"<[A-Z]\d+: ([^ ｜>]+) ｜ [A-Z]\d+: [^>]+>")


def seed_path(root):
    for cand in (os.environ.get("B300_SEED_FILE"), os.path.join(root, "..", "shared", "seeds", SEED_NAME),
                 os.path.join(root, "shared", "seeds", SEED_NAME), os.path.join(root, EXTRACT)):
        if cand and os.path.isfile(cand):
            return os.path.abspath(cand)
    return None


def fill(token):
    token = _ALT.sub(lambda m: m.group(1), token)
    return token.replace("<model-root>", "/models").replace("<rdma-device-list>", "mlx5_0,mlx5_1")


def serve_commands(text):
    """[{'name', 'version', 'argv', 'env'}] for every `sglang serve \\` block in the seed text."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != "sglang serve \\":
            continue
        env = {}
        j = i - 1
        while j >= 0 and re.match(r"^[A-Z_][A-Z0-9_]*=\S+ \\$", lines[j].strip()):
            k, v = lines[j].strip()[:-2].split("=", 1)
            env[k] = fill(v)
            j -= 1
        argv = []
        k = i + 1
        while k < len(lines):
            raw = lines[k].strip()
            cont = raw.endswith("\\")
            raw = raw[:-1].strip() if cont else raw
            if raw:
                argv += [t for t in fill(raw).split(" ") if t]
            k += 1
            if not cont:
                break
        name = argv[argv.index("--served-model-name") + 1]
        mode = argv[argv.index("--disaggregation-mode") + 1] if "--disaggregation-mode" in argv else "null"
        out.append({"name": "%s-%s" % (name, mode), "version": VERSION_BY_MODEL[name], "argv": argv, "env": env})
    return out


def long_names(argv, catalog):
    """Replace argparse prefix abbreviations (--tp, --dp) by the unique long option of the catalog."""
    return argparse_abbrev.long_names(argv, catalog)


def load(root):
    path = seed_path(root)
    if path is None:
        raise FileNotFoundError("seed %s not found next to %s (../shared/seeds)" % (SEED_NAME, root))
    with open(path, encoding="utf-8") as fh:
        return serve_commands(fh.read())
