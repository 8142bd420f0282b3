"""maleki_rs: seven research systems as one Python library with a Rust core.

Subsystems are imported lazily (``maleki_rs.pose``, ``maleki_rs.tessel``, ...), so
``import maleki_rs`` stays cheap and never imports optional dependencies (CuPy, scipy,
matplotlib). See :func:`show_config` for what this installation provides.
"""

# Imported under private names (and no ``from __future__ import annotations``, which would
# bind ``annotations``), so that ``dir(maleki_rs)`` lists the library's names only.
import importlib as _importlib
import importlib.util as _importlib_util
from typing import Any as _Any

from . import _core
from .exceptions import MalekiError

__version__: str = _core.__version__

#: Every subsystem of the design; the ones present in this installation are :data:`AVAILABLE`.
SUBSYSTEMS: tuple[str, ...] = ("pose", "tessel", "msgemm", "adasum", "symsgd", "any2vec", "hisa")
AVAILABLE: tuple[str, ...] = tuple(
    name for name in SUBSYSTEMS if _importlib_util.find_spec(f"{__name__}.{name}") is not None
)

__all__ = [
    "__version__",
    "SUBSYSTEMS",
    "AVAILABLE",
    "MalekiError",
    "set_num_threads",
    "get_num_threads",
    "show_config",
    *AVAILABLE,
]


def _check_thread_env() -> None:
    # The core reads MALEKI_RS_NUM_THREADS (pool size) and MALEKI_RS_SPIN_US (how long the helper
    # thread of short calls waits before it sleeps) and ignores a value outside their ranges:
    # a typo ("O", "1.5") would otherwise go unnoticed.
    _check_int_env("MALEKI_RS_NUM_THREADS", 1, 4096, lambda: f"maleki_rs uses {get_num_threads()} threads")
    _check_int_env("MALEKI_RS_SPIN_US", 0, 100000, lambda: "the helper thread waits 1000 us")


def _check_int_env(name: str, lo: int, hi: int, instead: _Any) -> None:
    """Warns when the environment variable ``name`` is set but not an integer in ``lo..=hi``
    (as Rust's ``usize`` parse reads it, after trimming); ``instead()`` says what is used."""
    import os

    value = os.environ.get(name, "").strip()
    digits = value.removeprefix("+")  # what Rust's usize parse takes
    if value and not (digits.isascii() and digits.isdigit() and lo <= int(digits) <= hi):
        import warnings

        warnings.warn(f"{name}={value!r} is not an integer from {lo} to {hi}: ignored, {instead()}",
                      RuntimeWarning, stacklevel=4)


def set_num_threads(n: int) -> None:
    """Sets the number of threads of maleki_rs's own thread pool.

    The default is the environment variable ``MALEKI_RS_NUM_THREADS``, else the number of
    available cores. maleki_rs never touches rayon's global pool, so other Rust extensions in
    the same process are unaffected. Calls already running keep their threads.

    Parameters
    ----------
    n : int
        Number of worker threads, ``n >= 1``.
    """
    from ._util.validate import check_int

    _core.set_num_threads(check_int(n, "n", min=1, max=4096))


def get_num_threads() -> int:
    """The number of threads of maleki_rs's thread pool."""
    return int(_core.get_num_threads())


def show_config(file: _Any = None) -> dict[str, _Any]:
    """Prints (and returns) the version, build, CPU features, threads and subsystems."""
    from . import _gpu

    info = dict(_core.build_info())
    info["num_threads"] = get_num_threads()
    info["subsystems"] = {name: (name in AVAILABLE) for name in SUBSYSTEMS}
    info["gpu"] = _gpu.describe()
    lines = [f"maleki_rs {info['version']}"]
    lines.append(f"  build: {'debug-assertions' if info['debug_assertions'] else 'release'}, "
                 f"{info['target_arch']}-{info['target_os']}")
    lines.append(f"  cpu features: {', '.join(info['cpu_features']) or 'none detected'}")
    lines.append(f"  threads: {info['num_threads']}")
    lines.append("  subsystems: " + ", ".join(f"{n} ({'available' if a else 'not built yet'})"
                                              for n, a in info["subsystems"].items()))
    lines.append(f"  gpu: {info['gpu']}")
    print("\n".join(lines), file=file)
    return info


def __getattr__(name: str) -> _Any:
    if name in AVAILABLE:
        module = _importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(AVAILABLE))


_check_thread_env()
