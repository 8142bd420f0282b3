"""Shared pytest configuration: markers, seeds, and the GPU auto-skip."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings

# Property tests are derandomized (the same examples on every run and machine) and have no
# per-example deadline: CI machines are shared and slow, and a deadline is a timing assertion.
settings.register_profile("maleki", derandomize=True, deadline=None, print_blob=True)
settings.load_profile("maleki")


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    from maleki_rs import _gpu

    reason = _gpu.unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"no GPU: {reason}")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


@pytest.fixture
def rng() -> np.random.Generator:
    """A fixed-seed generator: every test is deterministic."""
    return np.random.default_rng(20261202)
