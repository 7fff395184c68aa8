"""STAND-IN for torchvision (import-time only; see ../_standin.py). Not the real package."""
import _standin

_standin.install(__name__, "0.28.0")
