"""Schedules: the simulator, the validator, baselines and formats (spec §6-§8)."""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._core import tessel as _t
from .._util.validate import as_int_array, check_bool, check_choice, check_float, check_int
from ._premise import Premise

__all__ = [
    "Schedule",
    "Violation",
    "simulate",
    "baseline",
    "validate_template",
    "BASELINES",
    "FORMAT",
    "CONVENTIONS",
]

#: Names of the baseline generators.
BASELINES: tuple[str, ...] = tuple(_t.BASELINES)

#: The ``format`` tag of our JSON.
FORMAT: str = str(_t.FORMAT)

#: Memory conventions: deltas at block start (Tessel's) or frees at block end.
CONVENTIONS: tuple[str, ...] = ("start", "alloc_start_free_end")

_MAX_VALUE = 1 << 30
_NO_LIMIT = 1 << 62


@dataclass(frozen=True)
class Violation:
    """One violated rule of a schedule (V0-V4) or template (T1-T3).

    Attributes
    ----------
    rule : str
        ``"V0"`` (negative start), ``"V1"`` (precedence), ``"V2"`` (two jobs overlap on a
        device), ``"V3"`` (memory above the cap), ``"V4"`` (FIFO per block), ``"T1"``-``"T3"``.
    message : str
        What is wrong, naming the jobs and times.
    device : int or None
        The device, for V2/V3/T2/T3.
    jobs : tuple of (int, int)
        The jobs involved as ``(micro-batch, block)``.
    times : tuple of int
        The conflicting times (see the message).
    """

    rule: str
    message: str
    device: int | None
    jobs: tuple[tuple[int, int], ...]
    times: tuple[int, ...]

    def __str__(self) -> str:
        return self.message


def _violations(raw: list[dict[str, Any]]) -> list[Violation]:
    return [
        Violation(
            rule=v["rule"],
            message=v["message"],
            device=v["device"],
            jobs=tuple(tuple(x) for x in v["jobs"]),
            times=tuple(v["times"]),
        )
        for v in raw
    ]


def _check_premise(premise: Any) -> Premise:
    if not isinstance(premise, Premise):
        raise TypeError(
            f"premise: expected a maleki_rs.tessel.Premise (from tessel.premise(...) or "
            f"Premise.from_blocks(...)), got {type(premise).__name__}"
        )
    return premise


def _memory_arg(memory: Any, ndevs: int) -> tuple[int | None, ...] | None:
    """None (no cap), one cap for every device, or one per device (None = no cap there)."""
    if memory is None:
        return None
    if isinstance(memory, np.ndarray) and memory.ndim == 0:
        memory = memory[()]  # a 0-d array is its one value
    if isinstance(memory, (numbers.Integral, np.integer)) and not isinstance(memory, (bool, np.bool_)):
        return (check_int(memory, "memory", min=0, max=_NO_LIMIT),) * ndevs
    if isinstance(memory, (numbers.Real, np.floating)) and not isinstance(memory, (bool, np.bool_)):
        if np.isinf(memory) and memory > 0:
            return None
        raise TypeError(f"memory: expected an integer cap (or math.inf), got {memory!r}")
    if isinstance(memory, (str, bytes)) or not isinstance(memory, Iterable):
        raise TypeError(f"memory: expected None, an int or a sequence of ints, got {type(memory).__name__}")
    caps = []
    for d, m in enumerate(memory):
        unlimited = isinstance(m, (float, np.floating)) and np.isinf(m) and m > 0
        if m is None or unlimited:
            caps.append(None)
        else:
            caps.append(check_int(m, f"memory[{d}]", min=0, max=_NO_LIMIT))
    if len(caps) == 1:
        caps = caps * ndevs  # one cap for every device, as the schedule format reads it
    if len(caps) != ndevs:
        raise ValueError(f"memory: expected 1 or {ndevs} caps (one per device), got {len(caps)}")
    return None if all(c is None for c in caps) else tuple(caps)


def _read_text(text: Any, name: str = "text") -> str:
    """``text`` itself, or the contents of a file when given a path object."""
    if isinstance(text, os.PathLike):
        return Path(text).read_text()
    if not isinstance(text, str):
        raise TypeError(f"{name}: expected a str (or a pathlib.Path to read), got {type(text).__name__}")
    return text


def _write(path: Any, text: str) -> None:
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: expected a str or path, got {type(path).__name__}")
        Path(path).write_text(text)


class Schedule:
    """A schedule: an integer start for every job ``(micro-batch j, block g)`` of a premise.

    Parameters
    ----------
    premise : Premise
    starts : array_like of int, shape (nmicros, nblocks)
        ``starts[j, g]`` is the start of block ``g`` of micro-batch ``j``.
    memory : None, int or sequence of int/None
        Per-device memory caps used by :meth:`validate` (V3); None means unlimited.
    memory_convention : {"start", "alloc_start_free_end"}
        When a negative delta takes effect (at the block's start, Tessel's, or its end).
    fifo : bool
        Whether V4 (``S(g, j) < S(g, j+1)``) is part of validity.
    period, template, repetend : optional
        The steady period, the template (one start per block; ``K * nblocks`` starts for a
        K-periodic schedule, copy ``c`` of block ``g`` at ``c * nblocks + g``) and the repetend
        window ``(start, end)``, when the schedule came from a periodic search.
    name : str, optional
        What made it (``"1f1b"``, ``"tessel"``, ...).
    parameter_memory : int
        Copies of the model parameters per device (2 for Chimera).

    Notes
    -----
    Building a Schedule does not check validity; :meth:`validate` reports every violation.
    ``starts`` is copied and read-only.
    """

    def __init__(
        self,
        premise: Premise,
        starts: Any,
        *,
        memory: Any = None,
        memory_convention: str = "start",
        fifo: bool = True,
        period: int | None = None,
        template: Sequence[int] | None = None,
        repetend: tuple[int, int] | None = None,
        name: str | None = None,
        parameter_memory: int = 1,
    ) -> None:
        self._premise = _check_premise(premise)
        n = premise.nblocks
        arr = as_int_array(starts, "starts", shape=(None, n))
        if arr is starts or arr.base is starts:
            arr = arr.copy()
        if np.abs(arr).max(initial=0) > (1 << 50):
            raise ValueError("starts: values must lie within +-2**50")
        arr.setflags(write=False)
        self._starts: NDArray[np.int64] = arr
        self._memory = _memory_arg(memory, premise.ndevs)
        if not isinstance(memory_convention, str):
            raise TypeError(f"memory_convention: expected a str, got {type(memory_convention).__name__}")
        self._convention: str = check_choice(memory_convention, "memory_convention", CONVENTIONS)
        self._fifo = check_bool(fifo, "fifo")
        self._period = None if period is None else check_int(period, "period", min=1, max=_NO_LIMIT)
        if template is None:
            self._template: tuple[int, ...] | None = None
        else:
            # K-periodic schedules carry the template of the K-fold premise (K * nblocks).
            t = as_int_array(template, "template", ndim=1)
            if t.size % n != 0:
                raise ValueError(f"template: expected a multiple of {n} values (K * nblocks), got {t.size}")
            self._template = tuple(int(x) for x in t)
        if repetend is None:
            self._repetend: tuple[int, int] | None = None
        else:
            if isinstance(repetend, (str, bytes)) or not isinstance(repetend, Sequence) or len(repetend) != 2:
                raise TypeError(f"repetend: expected a (start, end) pair, got {repetend!r}")
            a, b = (check_int(x, "repetend", min=-_NO_LIMIT, max=_NO_LIMIT) for x in repetend)
            if b < a:
                raise ValueError(f"repetend: end {b} is before start {a}")
            spans = np.array([blk.span for blk in premise.blocks], dtype=np.int64)
            c = int((arr + spans).max(initial=0))
            if a < 0 or b > c:
                raise ValueError(f"repetend: the window [{a}, {b}) lies outside the schedule's [0, {c}] (its makespan)")
            self._repetend = (a, b)
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name: expected a str, got {type(name).__name__}")
        self._name = name
        self._parameter_memory = check_int(parameter_memory, "parameter_memory", min=1, max=64)
        self._metrics: dict[str, Any] | None = None

    # -- construction from the core ------------------------------------------------------------
    @classmethod
    def _from_core(cls, d: dict[str, Any]) -> Schedule:
        return cls(
            Premise(d["premise"]),
            d["starts"],
            memory=d["memory"],
            memory_convention=d["memory_convention"],
            fifo=d["fifo"],
            period=d["period"],
            template=d["template"],
            repetend=d["repetend"],
            name=d["name"],
            parameter_memory=d["parameter_memory"],
        )

    def _replace(self, **kw: Any) -> Schedule:
        args: dict[str, Any] = dict(
            memory=self._memory,
            memory_convention=self._convention,
            fifo=self._fifo,
            period=self._period,
            template=self._template,
            repetend=self._repetend,
            name=self._name,
            parameter_memory=self._parameter_memory,
        )
        args.update(kw)
        return Schedule(self._premise, self._starts, **args)

    def with_memory(self, memory: Any, memory_convention: str | None = None) -> Schedule:
        """The same schedule with other memory caps (and convention) for validation."""
        return self._replace(memory=memory, memory_convention=memory_convention or self._convention)

    # -- attributes -----------------------------------------------------------------------------
    @property
    def premise(self) -> Premise:
        return self._premise

    @property
    def starts(self) -> NDArray[np.int64]:
        """Start of every job, int64 ``(nmicros, nblocks)`` (read-only)."""
        return self._starts

    @property
    def nmicros(self) -> int:
        return int(self._starts.shape[0])

    @property
    def ndevs(self) -> int:
        return self._premise.ndevs

    @property
    def memory(self) -> tuple[int | None, ...] | None:
        """Per-device memory caps (None: unlimited)."""
        return self._memory

    @property
    def memory_convention(self) -> str:
        return self._convention

    @property
    def fifo(self) -> bool:
        return self._fifo

    @property
    def period(self) -> int | None:
        """The steady period ``P`` given by the search (see ``metrics()["period"]`` for the
        period detected in any schedule)."""
        return self._period

    @property
    def template(self) -> tuple[int, ...] | None:
        return self._template

    @property
    def repetend(self) -> tuple[int, int] | None:
        return self._repetend

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def parameter_memory(self) -> int:
        """Copies of the parameters each device holds (2 for Chimera)."""
        return self._parameter_memory

    def _mem_list(self) -> list[int | None] | None:
        return None if self._memory is None else list(self._memory)

    def metrics(self) -> dict[str, Any]:
        """Every metric of spec §7.

        Returns
        -------
        dict
            ``makespan`` (int), ``bubble_ratio`` (float), ``bubble_per_device``, ``busy``,
            ``idle`` (per device), ``peak_memory`` (this schedule's convention),
            ``peak_memory_start``, ``peak_memory_free_end``, ``inflight`` (most micro-batches
            in flight per device), ``period`` (``(P, first, last)`` detected in the middle, or
            None), ``critical_chain`` (list of ``(mb, block)``), ``slack`` (int64
            ``(nmicros, nblocks)``), ``lower_bound`` (``LB(N)``) and ``gap``
            (``C / LB(N) - 1``).
        """
        if self._metrics is None:
            self._metrics = dict(_t.metrics(self._premise._core, self._starts, self._mem_list(), self._convention))
        return dict(self._metrics)

    @property
    def makespan(self) -> int:
        """``C = max S + s``."""
        return int(self.metrics()["makespan"])

    @property
    def bubble_ratio(self) -> float:
        """``1 - N sum_d W_d / (D C)``."""
        return float(self.metrics()["bubble_ratio"])

    @property
    def peak_memory(self) -> NDArray[np.int64]:
        """Peak memory per device under the schedule's convention, int64 ``(D,)``."""
        return np.asarray(self.metrics()["peak_memory"], dtype=np.int64)

    @property
    def lower_bound(self) -> int:
        """``LB(N)``: no valid schedule of these micro-batches is shorter."""
        return int(self.metrics()["lower_bound"])

    @property
    def throughput(self) -> float:
        """Micro-batches per time unit over the whole run, ``N / C``."""
        return self.nmicros / self.makespan if self.makespan > 0 else 0.0

    # -- validity -------------------------------------------------------------------------------
    def validate(self, limit: int | None = 1000) -> list[Violation]:
        """Every violation of V0-V4 (at most ``limit`` of them; None for all).

        Returns an empty list when the schedule is valid.
        """
        lim = _NO_LIMIT if limit is None else check_int(limit, "limit", min=0, max=_NO_LIMIT)
        raw, _total = _t.validate(self._premise._core, self._starts, self._mem_list(), self._convention, self._fifo, lim)
        return _violations(raw)

    def count_violations(self) -> int:
        """The exact number of violations (without building them)."""
        return int(_t.validate(self._premise._core, self._starts, self._mem_list(), self._convention, self._fifo, 0)[1])

    @property
    def is_valid(self) -> bool:
        return self.count_violations() == 0

    # -- views ----------------------------------------------------------------------------------
    def orders(self) -> list[list[tuple[int, int]]]:
        """Per-device dispatch orders ``[(mb, block), ...]`` (jobs sorted by start)."""
        return [list(map(tuple, o)) for o in _t.orders(self._premise._core, self._starts)]

    def memory_timeline(self, device: int, memory_convention: str | None = None) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """``(times, levels)``: the memory of ``device`` is ``levels[k]`` on ``[times[k], times[k+1])``."""
        d = check_int(device, "device", min=0, max=self.ndevs - 1)
        conv = check_choice(memory_convention or self._convention, "memory_convention", CONVENTIONS)
        t, lv = _t.memory_timeline(self._premise._core, self._starts, d, conv)
        return t, lv

    # -- formats --------------------------------------------------------------------------------
    def to_json(self, path: Any = None) -> str:
        """Our JSON (``"format": "maleki_rs.tessel.schedule/1"``); also written to ``path``."""
        text = str(
            _t.to_json(
                self._premise._core,
                self._starts,
                self._mem_list(),
                self._convention,
                self._fifo,
                self._period,
                None if self._template is None else list(self._template),
                self._repetend,
                self._name,
                self._parameter_memory,
            )
        )
        _write(path, text)
        return text

    @classmethod
    def from_json(cls, text: str | os.PathLike[str]) -> Schedule:
        """Reads our JSON (text, or a ``pathlib.Path``)."""
        return cls._from_core(_t.from_json(_read_text(text)))

    def to_tessel_json(self, path: Any = None) -> str:
        """The reference's ``SchedPlan.save`` format (blocks with mid, gid, span, memory, btype,
        step, device, and the repetend)."""
        text = str(_t.to_tessel_json(self._premise._core, self._starts, self._repetend))
        _write(path, text)
        return text

    @classmethod
    def from_tessel_json(cls, text: str | os.PathLike[str], premise: Premise | None = None) -> Schedule:
        """Reads the reference's JSON. Its entries must match ``premise``; without one, the
        premise is the chain of the blocks in gid order."""
        core = None if premise is None else _check_premise(premise)._core
        return cls._from_core(_t.from_tessel_json(_read_text(text), core))

    def to_text(self, compact: bool = False) -> str:
        """The text grid of the reference's printout (``|`` at the repetend boundaries), or
        per-device order lists with ``compact=True``."""
        return str(_t.to_text(self._premise._core, self._starts, self._repetend, check_bool(compact, "compact")))

    @classmethod
    def from_text(cls, text: str | os.PathLike[str], premise: Premise) -> Schedule:
        """Reads a text grid for ``premise`` (the repetend comes from the ``|`` marks)."""
        return cls._from_core(_t.from_text(_read_text(text), _check_premise(premise)._core))

    def to_csv(self, path: Any = None) -> str:
        """torch.distributed.pipelining's compute-only CSV: one row per rank of actions
        ``<stage><F|B|I|W><mb>`` (pipeline premises) or ``<block><F|B|W|O><mb>``."""
        text = str(_t.to_csv(self._premise._core, self._starts))
        _write(path, text)
        return text

    @classmethod
    def from_csv(
        cls,
        text: str | os.PathLike[str],
        premise: Premise,
        *,
        memory: Any = None,
        memory_convention: str = "start",
        lag: int | Sequence[int] | None = None,
    ) -> Schedule:
        """Reads a compute-only CSV and times its orders with :func:`simulate`."""
        nm, orders = _t.csv_to_orders(_read_text(text), _check_premise(premise)._core)
        return simulate(premise, orders, nmicros=nm, memory=memory, memory_convention=memory_convention, lag=lag)

    def to_svg(
        self,
        path: Any = None,
        *,
        memory: bool = True,
        repetend: bool = True,
        title: str | None = None,
        width: float = 960.0,
    ) -> str:
        """An SVG Gantt chart (no dependency): devices on y, time on x, colours by kind,
        hatched multi-device blocks, micro-batch labels, red repetend lines, an optional memory
        panel, and a title with makespan, bubble ratio and period."""
        if title is not None and not isinstance(title, str):
            raise TypeError(f"title: expected a str, got {type(title).__name__}")
        text = str(
            _t.to_svg(
                self._premise._core,
                self._starts,
                self._mem_list(),
                self._convention,
                self._period,
                self._repetend,
                check_bool(memory, "memory"),
                check_bool(repetend, "repetend"),
                title if title is not None else self._name,
                check_float(width, "width", min=50.0, max=100000.0),
            )
        )
        _write(path, text)
        return text

    def title(self, title: str | None = None) -> str:
        """The Gantt title: ``[title — ]makespan C, bubble ratio x%, P = p``."""
        return str(_t.title_line(self._premise._core, self._starts, self._period, title if title is not None else self._name))

    # -- python protocol -------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return (
            self._premise == other._premise
            and np.array_equal(self._starts, other._starts)
            and self._memory == other._memory
            and self._convention == other._convention
            and self._fifo == other._fifo
            and self._period == other._period
            and self._template == other._template
            and self._repetend == other._repetend
            and self._name == other._name
            and self._parameter_memory == other._parameter_memory
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (Schedule.from_json, (self.to_json(),))

    def __repr__(self) -> str:
        label = f"{self._name!r}, " if self._name else ""
        return (
            f"Schedule({label}ndevs={self.ndevs}, nmicros={self.nmicros}, makespan={self.makespan}, "
            f"bubble_ratio={self.bubble_ratio:.3f})"
        )


def _orders_arg(orders: Any, ndevs: int) -> list[list[tuple[int, int]]]:
    if isinstance(orders, (str, bytes)) or not isinstance(orders, Sequence):
        raise TypeError(f"orders: expected one sequence of (micro-batch, block) pairs per device, got {type(orders).__name__}")
    if len(orders) != ndevs:
        raise ValueError(f"orders: expected {ndevs} lists (one per device), got {len(orders)}")
    out = []
    for d, o in enumerate(orders):
        if isinstance(o, (str, bytes)) or not isinstance(o, Iterable):
            raise TypeError(f"orders[{d}]: expected a sequence of (micro-batch, block) pairs")
        lst = []
        for k, x in enumerate(o):
            if isinstance(x, (str, bytes)) or not isinstance(x, Sequence) or len(x) != 2:
                raise TypeError(f"orders[{d}][{k}]: expected a (micro-batch, block) pair, got {x!r}")
            lst.append((check_int(x[0], f"orders[{d}][{k}]", min=0, max=1 << 40), check_int(x[1], f"orders[{d}][{k}]", min=0, max=1 << 40)))
        out.append(lst)
    return out


def simulate(
    premise: Premise,
    orders: Sequence[Sequence[tuple[int, int]]] | None = None,
    *,
    starts: Any = None,
    nmicros: int | None = None,
    memory: Any = None,
    memory_convention: str = "start",
    fifo: bool = True,
    lag: int | Sequence[int] | None = None,
    name: str | None = None,
) -> Schedule:
    """Times per-device orders as soon as possible, or wraps explicit starts.

    Parameters
    ----------
    premise : Premise
    orders : list of list of (int, int), optional
        ``orders[d]`` lists the jobs ``(micro-batch, block)`` device ``d`` runs, in order. A
        multi-device job appears in the list of each of its devices; the lists must agree on
        the relative order of shared jobs.
    starts : array_like of int, shape (nmicros, nblocks), optional
        Explicit starts instead of orders (then nothing is timed).
    nmicros : int, optional
        Number of micro-batches (default: the largest index in ``orders`` + 1).
    memory, memory_convention, fifo
        Instance parameters kept on the schedule (see :class:`Schedule`).
    lag : int or sequence of int, optional
        Communication lag: one value for every edge between blocks on different device sets,
        or one value per edge. Default: the premise's own lags.

    Returns
    -------
    Schedule

    Raises
    ------
    maleki_rs.exceptions.DeadlockError
        The orders (with the dependencies) form a cycle; the message names it.
    ValueError
        Malformed orders (a job missing, repeated, or on a device it does not use).
    """
    premise = _check_premise(premise)
    if (orders is None) == (starts is None):
        raise ValueError("simulate(): give exactly one of orders= and starts=")
    if starts is not None:
        if lag is not None:
            raise ValueError("simulate(): lag applies to orders only")
        if np.ndim(starts) != 2:
            raise ValueError(f"starts: expected shape (nmicros, {premise.nblocks}), got {np.shape(starts)}")
        if nmicros is not None and np.shape(starts)[0] != nmicros:
            raise ValueError(f"nmicros: {nmicros} does not match starts with {np.shape(starts)[0]} rows")
        return Schedule(premise, starts, memory=memory, memory_convention=memory_convention, fifo=fifo, name=name)
    ords = _orders_arg(orders, premise.ndevs)
    nm = max((j for o in ords for j, _ in o), default=-1) + 1
    if nmicros is not None:
        nm = check_int(nmicros, "nmicros", min=1, max=1 << 24)
    if nm < 1:
        raise ValueError("orders: no jobs given")
    lag_arg: Any
    if lag is None:
        lag_arg = None
    elif isinstance(lag, (numbers.Integral, np.integer)) and not isinstance(lag, (bool, np.bool_)):
        lag_arg = check_int(lag, "lag", min=0, max=_MAX_VALUE)
    else:
        if isinstance(lag, (str, bytes)) or not isinstance(lag, Iterable):
            raise TypeError(f"lag: expected an int or one int per edge, got {type(lag).__name__}")
        lag_arg = [check_int(c, "lag", min=0, max=_MAX_VALUE) for c in lag]
        if len(lag_arg) != len(premise.edges):
            raise ValueError(f"lag: expected {len(premise.edges)} values (one per edge), got {len(lag_arg)}")
    d = _t.simulate_orders(premise._core, nm, ords, lag_arg)
    s = Schedule._from_core(d)
    return s._replace(memory=memory, memory_convention=memory_convention, fifo=fifo, name=name)


def baseline(
    name: str,
    premise: Premise,
    nmicros: int,
    *,
    memory: Any = None,
    memory_convention: str = "start",
) -> Schedule:
    """A baseline schedule (spec §6), timed by the simulator.

    Parameters
    ----------
    name : str
        One of :data:`BASELINES`: ``gpipe``, ``1f1b``, ``1f1b+``, ``chimera``,
        ``interleaved_1f1b``, ``zb_h1``, ``zb_h2``, ``inference_pipe``.
    premise : Premise
        ``1f1b``/``gpipe`` take any premise; ``1f1b+`` a pipeline plus multi-device blocks
        (mshape, nnshape); ``chimera`` a V pipeline (or xshape); ``interleaved_1f1b`` the
        ``interleaved`` premise; ``zb_h1``/``zb_h2`` the ``zb_v`` premise;
        ``inference_pipe`` a forward-only premise.
    nmicros : int
        Micro-batches (``chimera`` on a V: even, and the schedule's rows are down/up pairs;
        ``interleaved_1f1b``: a multiple of D).
    memory, memory_convention
        Caps and convention kept on the schedule for validation (baselines ignore them).

    Returns
    -------
    Schedule
        With ``name`` set and ``parameter_memory`` (2 for Chimera).
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a baseline name (str), got {type(name).__name__}")
    canonical = _t.canonical_baseline(name)
    premise = _check_premise(premise)
    nm = check_int(nmicros, "nmicros", min=1, max=1 << 24)
    d = _t.baseline(canonical, premise._core, nm)
    s = Schedule._from_core(d)
    return s._replace(memory=memory, memory_convention=memory_convention)


def validate_template(
    premise: Premise,
    template: Sequence[int],
    period: int,
    *,
    memory: Any = None,
    memory_convention: str = "start",
    limit: int | None = 1000,
) -> list[Violation]:
    """Every violation of T1-T3 for a 1-periodic template ``S(g, j) = template[g] + j P``.

    T1: precedence; T2: the blocks of a device overlap modulo ``P`` (or its work exceeds
    ``P``); T3: the exact steady-state peak memory exceeds the cap.
    """
    premise = _check_premise(premise)
    t = as_int_array(template, "template", shape=(premise.nblocks,))
    if np.abs(t).max(initial=0) > (1 << 50):
        raise ValueError("template: values must lie within +-2**50")
    per = check_int(period, "period", min=1, max=1 << 50)
    mem = _memory_arg(memory, premise.ndevs)
    conv = check_choice(memory_convention, "memory_convention", CONVENTIONS)
    lim = _NO_LIMIT if limit is None else check_int(limit, "limit", min=0, max=_NO_LIMIT)
    raw, _ = _t.validate_template(premise._core, per, [int(x) for x in t], None if mem is None else list(mem), conv, lim)
    return _violations(raw)
