"""Seed handling: every stochastic API takes a keyword-only ``seed``.

``None`` draws fresh entropy through :class:`numpy.random.SeedSequence`; the seed actually
used is returned so that results can store it and be reproduced.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .validate import check_int

__all__ = ["resolve_seed", "generator"]


def resolve_seed(seed: Any) -> int:
    """The 64-bit seed to use: ``seed`` itself (0 <= seed < 2**64) or fresh entropy."""
    if seed is None:
        return int(np.random.SeedSequence().generate_state(1, dtype=np.uint64)[0])
    return check_int(seed, "seed", min=0, max=2**64 - 1)


def generator(seed: int, *key: int) -> np.random.Generator:
    """A numpy Generator for the stream ``(seed, *key)`` (independent streams per key)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=tuple(key)))
