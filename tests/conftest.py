"""Shared pytest setup: make module_utils importable as ansible.module_utils.<name>, locate fixtures."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

try:
    import ansible.module_utils as _amu

    _mu = str(ROOT / "module_utils")
    if _mu not in _amu.__path__:
        _amu.__path__.append(_mu)
except ImportError:  # pragma: no cover - ansible-core is in requirements.txt
    pass


def _real_fixture_dir():
    env = os.environ.get("B300_REAL_FIXTURES")
    candidates = [env] if env else []
    candidates += [ROOT.parent / "shared" / "fixtures" / "real", ROOT / "tests" / "fixtures" / "real"]
    for c in candidates:
        if c and pathlib.Path(c).is_dir():
            return pathlib.Path(c)
    return None


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def real_fixtures():
    """Directory of the REAL captures (../shared/fixtures/real). Tests using it fail loudly when it is missing."""
    d = _real_fixture_dir()
    if d is None:
        pytest.fail("real fixtures not found: expected ../shared/fixtures/real next to the checkout")
    return d


@pytest.fixture(scope="session")
def synth_fixtures():
    return ROOT / "tests" / "fixtures" / "synth"
