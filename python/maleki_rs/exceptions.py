"""Exceptions raised by maleki_rs.

Every class derives from :class:`MalekiError` *and* from the builtin a caller would expect,
so ``except ValueError`` keeps working. Bad arguments raise plain ``ValueError`` /
``TypeError`` naming the argument; the classes below are for failures of the problem itself.
A buffer that does not fit in memory (the caches msgemm builds for large weights, say) raises
the builtin ``MemoryError``, naming the buffer and its size; the process goes on.
The compiled core maps its errors onto these classes in exactly one place
(``rust/maleki-py/src/errors.rs``).
"""

from __future__ import annotations

__all__ = [
    "MalekiError",
    "DegenerateGeometryError",
    "NumericalError",
    "ConvergenceError",
    "InfeasibleError",
    "DeadlockError",
    "GPUUnavailableError",
]


class MalekiError(Exception):
    """Base class of every maleki_rs-specific exception."""


class DegenerateGeometryError(MalekiError, ValueError):
    """The data do not determine the unknowns (e.g. collinear points leave a rotation free)."""


class NumericalError(MalekiError, ArithmeticError):
    """A numerical failure, e.g. a matrix that must be positive definite is not."""


class ConvergenceError(MalekiError, RuntimeError):
    """An iterative method reached its iteration limit (raised only with ``strict=True``)."""


class InfeasibleError(MalekiError, ValueError):
    """The constraints admit no solution (e.g. a memory cap no schedule can meet)."""


class DeadlockError(MalekiError, ValueError):
    """Per-device orders that can never all make progress."""


class GPUUnavailableError(MalekiError, RuntimeError):
    """A GPU entry point was called where CuPy or a CUDA device is not available."""
