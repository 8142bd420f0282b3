"""Premises: the placement of one micro-batch (spec §1 and §5)."""

from __future__ import annotations

import json
import numbers
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .._core import tessel as _t
from .._util.validate import check_bool, check_int

__all__ = ["Block", "Premise", "premise", "PREMISES", "KINDS"]

#: Names of the built-in premises.
PREMISES: tuple[str, ...] = tuple(_t.PREMISES)

#: Block kinds.
KINDS: tuple[str, ...] = ("forward", "backward", "weight", "other")

# Keyword options of the built-in premises and the check each value gets.
_SPAN_OPTIONS = ("fwd", "bwd", "wgt", "tp_fwd", "tp_bwd")
_MEMORY_OPTIONS = ("act", "tp_mem")
_OPTIONS = (*_SPAN_OPTIONS, *_MEMORY_OPTIONS, "chunks", "fwd_spans", "bwd_spans")

# Spans, lags and |memory| are capped in the core at 2**30.
_MAX_VALUE = 1 << 30


@dataclass(frozen=True)
class Block:
    """One block of a premise.

    Attributes
    ----------
    span : int
        Duration in time units (>= 1).
    devices : tuple of int
        The devices the block occupies, all at once (several devices: a tensor-parallel block).
    memory : int
        Memory delta applied on each of its devices when it starts: + allocates, - frees.
    kind : str
        ``"forward"``, ``"backward"``, ``"weight"`` (weight-gradient half of a split backward)
        or ``"other"``.
    name : str
        Display name.
    """

    span: int
    devices: tuple[int, ...]
    memory: int = 0
    kind: str = "forward"
    name: str = ""


def _as_devices(value: Any, where: str) -> tuple[int, ...]:
    if isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return (check_int(value, f"{where}.devices", min=0, max=4095),)
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{where}.devices: expected an int or a sequence of ints, got {type(value).__name__}")
    devs = tuple(check_int(d, f"{where}.devices", min=0, max=4095) for d in value)
    if not devs:
        raise ValueError(f"{where}.devices: the device set is empty")
    return devs


def _as_block(item: Any, g: int) -> Block:
    where = f"blocks[{g}]"
    if isinstance(item, Block):
        fields = {"span": item.span, "devices": item.devices, "memory": item.memory, "kind": item.kind, "name": item.name}
    elif isinstance(item, Mapping):
        unknown = set(item) - {"span", "devices", "memory", "kind", "name"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; allowed: span, devices, memory, kind, name")
        if "span" not in item or "devices" not in item:
            raise ValueError(f"{where}: 'span' and 'devices' are required")
        fields = dict(item)
    else:
        raise TypeError(f"{where}: expected a Block or a dict, got {type(item).__name__}")
    kind = fields.get("kind", "forward")
    if not isinstance(kind, str):
        raise TypeError(f"{where}.kind: expected a string, got {type(kind).__name__}")
    if kind.lower() not in KINDS:
        raise ValueError(f"{where}.kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    name = fields.get("name") or f"g{g}"
    if not isinstance(name, str):
        raise TypeError(f"{where}.name: expected a string, got {type(name).__name__}")
    return Block(
        span=check_int(fields["span"], f"{where}.span", min=1, max=_MAX_VALUE),
        devices=_as_devices(fields["devices"], where),
        memory=check_int(fields.get("memory", 0), f"{where}.memory", min=-_MAX_VALUE, max=_MAX_VALUE),
        kind=kind.lower(),
        name=name,
    )


class Premise:
    """A validated premise: blocks (span, devices, memory delta, kind, name) and edges.

    Build one with :func:`premise` (the built-in placements) or :meth:`Premise.from_blocks`.
    A premise is immutable, hashable and picklable.
    """

    __slots__ = ("_core",)

    def __init__(self, core: Any) -> None:
        if not isinstance(core, _t.Premise):
            raise TypeError(
                "Premise objects are built with maleki_rs.tessel.premise(...) or Premise.from_blocks(...)"
            )
        self._core = core

    @classmethod
    def from_blocks(
        cls,
        blocks: Sequence[Block | Mapping[str, Any]],
        edges: Iterable[Sequence[int]] = (),
        *,
        ndevs: int | None = None,
        lags: Sequence[int] | Mapping[tuple[int, int], int] | None = None,
    ) -> Premise:
        """A premise from blocks and precedence edges.

        Parameters
        ----------
        blocks : sequence of Block or dict
            Each with ``span`` (int >= 1), ``devices`` (int or sequence of ints), optional
            ``memory`` (int, default 0), ``kind`` (default ``"forward"``) and ``name``.
        edges : iterable of (int, int)
            ``(g, h)``: block ``h`` of a micro-batch starts after block ``g`` of the same
            micro-batch ends. Must form a DAG.
        ndevs : int, optional
            Number of devices (default: the largest device used + 1).
        lags : sequence of int or dict, optional
            Communication delay per edge (in the order of ``edges``, or keyed by ``(g, h)``).

        Raises
        ------
        ValueError
            A cycle (named), an empty device set, a device out of range, memory deltas of a
            device that do not sum to 0 or that can go negative, a repeated edge, ...
        TypeError
            Values of the wrong type.
        """
        if isinstance(blocks, (str, bytes, Mapping)) or not isinstance(blocks, Sequence):
            raise TypeError(f"blocks: expected a sequence of Block or dict, got {type(blocks).__name__}")
        bl = [_as_block(b, g) for g, b in enumerate(blocks)]
        if not bl:
            raise ValueError("blocks: a premise needs at least one block")
        if isinstance(edges, (str, bytes)) or not isinstance(edges, Iterable):
            raise TypeError(f"edges: expected an iterable of (from, to) pairs, got {type(edges).__name__}")
        ed = []
        for k, e in enumerate(edges):
            if isinstance(e, (str, bytes)) or not isinstance(e, Sequence) or len(e) != 2:
                raise TypeError(f"edges[{k}]: expected a (from, to) pair, got {e!r}")
            ed.append((check_int(e[0], f"edges[{k}][0]", min=0, max=1 << 40), check_int(e[1], f"edges[{k}][1]", min=0, max=1 << 40)))
        if lags is None:
            lg = [0] * len(ed)
        elif isinstance(lags, Mapping):
            for k in lags:
                if isinstance(k, (str, bytes)) or not isinstance(k, Sequence) or len(k) != 2:
                    raise TypeError(f"lags: keys must be (from, to) edges, got {k!r}")
            keys = {tuple(k) for k in lags}
            unknown = keys - set(ed)
            if unknown:
                raise ValueError(f"lags: {sorted(unknown)} are not edges")
            lg = [check_int(lags.get(e, 0), f"lags[{e}]", min=0, max=_MAX_VALUE) for e in ed]
        else:
            lg = [check_int(c, f"lags[{k}]", min=0, max=_MAX_VALUE) for k, c in enumerate(lags)]
            if len(lg) != len(ed):
                raise ValueError(f"lags: {len(lg)} values for {len(ed)} edges")
        used = max(d for b in bl for d in b.devices) + 1
        nd = used if ndevs is None else check_int(ndevs, "ndevs", min=1, max=4096)
        core = _t.Premise.from_parts(
            nd,
            [b.name for b in bl],
            [b.span for b in bl],
            [list(b.devices) for b in bl],
            [b.memory for b in bl],
            [b.kind for b in bl],
            ed,
            lg,
        )
        return cls(core)

    # -- properties ---------------------------------------------------------------------------
    @property
    def ndevs(self) -> int:
        """Number of devices ``D``."""
        return int(self._core.ndevs)

    @property
    def nblocks(self) -> int:
        """Number of blocks ``n``."""
        return int(self._core.nblocks)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The blocks, in index order (devices sorted)."""
        return tuple(
            Block(span=s, devices=tuple(d), memory=m, kind=k, name=nm) for nm, s, d, m, k in self._core.blocks
        )

    @property
    def edges(self) -> tuple[tuple[int, int], ...]:
        """Precedence edges ``(g, h)`` as pairs of block indices."""
        return tuple((a, b) for a, b, _ in self._core.edges)

    @property
    def lags(self) -> tuple[int, ...]:
        """Communication lag of each edge (0 when none)."""
        return tuple(c for _, _, c in self._core.edges)

    @property
    def work(self) -> NDArray[np.int64]:
        """``W_d``: total span of the blocks on each device, int64 ``(D,)``."""
        return np.asarray(self._core.work, dtype=np.int64)

    @property
    def heads(self) -> NDArray[np.int64]:
        """Longest path from a source to the start of each block, int64 ``(n,)``."""
        return np.asarray(self._core.heads, dtype=np.int64)

    @property
    def tails(self) -> NDArray[np.int64]:
        """Longest path from the end of each block to the end of a sink, int64 ``(n,)``."""
        return np.asarray(self._core.tails, dtype=np.int64)

    @property
    def topo_order(self) -> tuple[int, ...]:
        """A topological order of the blocks."""
        return tuple(self._core.topo_order)

    @property
    def critical_path(self) -> int:
        """Latency of one micro-batch alone."""
        return int(self._core.critical_path)

    @property
    def period_lower_bound(self) -> int:
        """``max_d W_d``: no steady period can be shorter."""
        return int(self._core.period_lower_bound)

    @property
    def is_inference(self) -> bool:
        """True when every memory delta is 0."""
        return all(b.memory == 0 for b in self.blocks)

    def lower_bound(self, nmicros: int) -> int:
        """``LB(N)`` of spec §2: no valid schedule of ``nmicros`` micro-batches is shorter."""
        return int(self._core.lower_bound(check_int(nmicros, "nmicros", min=0)))

    def stages(self) -> list[tuple[int, int, int | None, int | None]] | None:
        """``[(device, forward, backward, weight), ...]`` when the premise is a pipeline, else None."""
        return self._core.stages(False)

    # -- serialisation -----------------------------------------------------------------------
    def to_json(self) -> str:
        """The premise as JSON text (the ``premise`` object of the schedule format)."""
        return str(self._core.to_json())

    @classmethod
    def from_json(cls, text: str) -> Premise:
        """Reads :meth:`to_json` text."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a str, got {type(text).__name__}")
        return cls(_t.Premise.from_json(text))

    def to_dict(self) -> dict[str, Any]:
        """The premise as plain Python data."""
        return json.loads(self.to_json())

    def __reduce__(self) -> tuple[Any, ...]:
        return (Premise.from_json, (self.to_json(),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Premise) and self._core == other._core

    def __hash__(self) -> int:
        return hash(self._core)

    def __repr__(self) -> str:
        return f"Premise(ndevs={self.ndevs}, nblocks={self.nblocks}, edges={len(self.edges)}, work={self.work.tolist()})"


def premise(name: str, ndevs: int = 4, *, train: bool = True, **spans: Any) -> Premise:
    """A built-in premise (spec §5).

    Parameters
    ----------
    name : str
        One of :data:`PREMISES`: ``vshape``, ``mshape``, ``nnshape``, ``nnshape_eager``,
        ``mllm``, ``kshape``, ``xshape``, ``finetune``, ``alphafold``, ``interleaved``,
        ``zb_v``, ``wave``, ``uneven``.
    ndevs : int
        Number of devices (``kshape`` needs an even number; ``nnshape``, ``xshape`` at least 2).
    train : bool
        Training form (default) or inference form (forward blocks only, memory 0).
    **spans
        ``fwd``, ``bwd``, ``wgt``, ``tp_fwd``, ``tp_bwd`` (spans, >= 1); ``act`` (activation
        memory of a forward, >= 0); ``tp_mem`` (memory of the tensor-parallel forwards);
        ``chunks`` (v of ``interleaved``, waves of ``wave``); ``fwd_spans``/``bwd_spans``
        (per-stage spans of ``uneven``). Defaults follow Tessel: f=1, b=3, tp=1, act=1.
        An option the premise does not read is a ValueError naming the ones it does (``vshape``,
        ``xshape``, ``alphafold``: fwd, bwd, act; ``mshape``, ``nnshape``, ``nnshape_eager``,
        ``mllm``: those and tp_fwd, tp_bwd, tp_mem; ``kshape``: tp_fwd, tp_bwd, no tp_mem;
        ``finetune``: tp_fwd only; ``interleaved``, ``wave``: chunks; ``zb_v``: wgt;
        ``uneven``: fwd_spans, bwd_spans, each instead of fwd, bwd). The inference form
        ignores the training-only ones (bwd, tp_bwd, wgt, act, tp_mem).

    Examples
    --------
    >>> from maleki_rs import tessel
    >>> p = tessel.premise("mshape", ndevs=4)
    >>> p.work.tolist()
    [6, 6, 6, 6]
    """
    if not isinstance(name, str):
        raise TypeError(f"name: expected a premise name (str), got {type(name).__name__}")
    if name not in PREMISES:
        raise ValueError(f"name: unknown premise {name!r}; the built-in premises are {', '.join(PREMISES)}")
    nd = check_int(ndevs, "ndevs", min=1, max=4096)
    unknown = sorted(set(spans) - set(_OPTIONS))
    if unknown:
        raise TypeError(f"premise(): unknown keyword(s) {unknown}; accepted: {', '.join(_OPTIONS)}, train")
    opts: dict[str, Any] = {"train": check_bool(train, "train")}
    for k, v in spans.items():
        if v is None:
            continue
        if k in _SPAN_OPTIONS:
            opts[k] = check_int(v, k, min=1, max=_MAX_VALUE)
        elif k in _MEMORY_OPTIONS:
            opts[k] = check_int(v, k, min=0, max=_MAX_VALUE)
        elif k == "chunks":
            opts[k] = check_int(v, k, min=1, max=64)
        else:  # fwd_spans / bwd_spans
            if isinstance(v, (str, bytes)) or not isinstance(v, Iterable):
                raise TypeError(f"{k}: expected a sequence of ints, got {type(v).__name__}")
            vals = [check_int(x, k, min=1, max=_MAX_VALUE) for x in v]
            if len(vals) != nd:
                raise ValueError(f"{k}: expected {nd} values (one per stage), got {len(vals)}")
            opts[k] = vals
    return Premise(_t.Premise.builtin(name, nd, opts))
