"""STAND-IN for torchvision (import-time only, NOT the real package) for the sandbox's acceptance client: reuses
tools/sglang_argcheck/standins/_standin.py (image datasets are never used by the generated-shared-prefix run)."""
import os
import sys

sys.path.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tools", "sglang_argcheck",
                             "standins"))
import _standin

_standin.install(__name__, "0.28.0")
