"""tests/parser: checks against the REAL sglang parsers (CPU venvs under .cache/sglang-argcheck, built on demand)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "real_parser: needs the CPU venvs with the real sglang (tools/sglang_argcheck/build_venv.sh); "
                   "run as its own step: pytest -m real_parser tests/parser")
