"""The test tiers (tests/conftest.py): `python -m pytest tests` runs the quick tier; values and tests
marked FULL run with `--full` (CI).  A parametrized test keeps at least one value in the quick tier,
so every feature runs there; its other sizes, world sizes and dtypes are the full tier's."""
import pytest

FULL = pytest.mark.full


def full(*values):
    """Parameter values that run only in the full tier: ``[2, *full(3, 4)]``."""
    return [pytest.param(v, marks=FULL) for v in values]
