"""Import-time stand-in for the `datasets` package (NOT the real one) for the sandbox's acceptance client.

sglang 0.5.17's benchmark imports `from datasets import load_dataset` at module level for the MMMU/LongBench datasets;
the acceptance run uses the generated-shared-prefix dataset, which needs only the tokenizer. The controller's CPU
venv (tools/sglang_argcheck/build_venv.sh) does not hold `datasets` (pyarrow and friends); this stand-in lets the real
client import and refuses loudly if anything actually tries to load a hub dataset.
"""


def load_dataset(*args, **kwargs):
    raise RuntimeError("datasets stand-in (sandbox/client_standins): load_dataset(%r) is not available offline; "
                       "the acceptance run uses --dataset-name generated-shared-prefix" % (args[:1],))
