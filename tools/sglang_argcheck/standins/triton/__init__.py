"""STAND-IN for triton (import-time only; see ../_standin.py). Not the real package."""
import _standin

_standin.install(__name__, "3.5.0", raising=("triton.runtime.driver",))
