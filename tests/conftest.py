"""Shared pytest setup: locate fixtures. The project's collection (ansible_collections.b300.rollout.plugins.*) and
the scripts the tests import are on sys.path through pytest.ini's pythonpath (issue 39: the one way in)."""
import os
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


# The REAL captures live in the repository (sandbox/hwemu/real, copied from the project's shared captures), so a
# fresh clone anywhere finds them; B300_REAL_FIXTURES overrides (e.g. ../shared/fixtures/real with newer captures).
REAL_IN_REPO = ROOT / "sandbox" / "hwemu" / "real"


def _real_fixture_dir():
    env = os.environ.get("B300_REAL_FIXTURES")
    candidates = [env] if env else []
    candidates += [REAL_IN_REPO, ROOT.parent / "shared" / "fixtures" / "real"]
    for c in candidates:
        if c and pathlib.Path(c).is_dir():
            return pathlib.Path(c)
    return None


@pytest.fixture(scope="session")
def repo_root():
    return ROOT


@pytest.fixture(scope="session")
def real_fixtures():
    """Directory of the REAL captures (sandbox/hwemu/real in the repository). Tests using it fail loudly when it is
    missing."""
    d = _real_fixture_dir()
    if d is None:
        pytest.fail("real fixtures not found: expected %s (or B300_REAL_FIXTURES)" % REAL_IN_REPO)
    return d


@pytest.fixture(scope="session")
def synth_fixtures():
    return ROOT / "tests" / "fixtures" / "synth"
