"""Type stubs of ``maleki_rs._core.tessel`` (private; use ``maleki_rs.tessel``)."""

from typing import Any

import numpy as np
from numpy.typing import NDArray

PREMISES: list[str]
BASELINES: list[str]
FORMAT: str

_Mem = list[int | None] | None
_Starts = NDArray[np.int64]

class Premise:
    @staticmethod
    def builtin(name: str, ndevs: int, options: dict[str, Any]) -> Premise: ...
    @staticmethod
    def from_parts(
        ndevs: int,
        names: list[str],
        spans: list[int],
        devices: list[list[int]],
        memory: list[int],
        kinds: list[str],
        edges: list[tuple[int, int]],
        lags: list[int],
    ) -> Premise: ...
    @staticmethod
    def from_json(text: str) -> Premise: ...
    def to_json(self) -> str: ...
    @property
    def ndevs(self) -> int: ...
    @property
    def nblocks(self) -> int: ...
    @property
    def blocks(self) -> list[tuple[str, int, list[int], int, str]]: ...
    @property
    def edges(self) -> list[tuple[int, int, int]]: ...
    @property
    def work(self) -> list[int]: ...
    @property
    def heads(self) -> list[int]: ...
    @property
    def tails(self) -> list[int]: ...
    @property
    def topo_order(self) -> list[int]: ...
    @property
    def critical_path(self) -> int: ...
    @property
    def period_lower_bound(self) -> int: ...
    def lower_bound(self, nmicros: int) -> int: ...
    def stages(self, allow_multi: bool) -> list[tuple[int, int, int | None, int | None]] | None: ...
    def __eq__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...

def validate(
    premise: Premise, starts: _Starts, memory: _Mem, convention: str, fifo: bool, limit: int
) -> tuple[list[dict[str, Any]], int]: ...
def validate_template(
    premise: Premise, period: int, template: list[int], memory: _Mem, convention: str, limit: int
) -> tuple[list[dict[str, Any]], int]: ...
def metrics(premise: Premise, starts: _Starts, memory: _Mem, convention: str) -> dict[str, Any]: ...
def memory_timeline(
    premise: Premise, starts: _Starts, device: int, convention: str
) -> tuple[NDArray[np.int64], NDArray[np.int64]]: ...
def orders(premise: Premise, starts: _Starts) -> list[list[tuple[int, int]]]: ...
def simulate_orders(premise: Premise, nmicros: int, orders: list[list[tuple[int, int]]], lag: Any) -> dict[str, Any]: ...
def baseline(name: str, premise: Premise, nmicros: int) -> dict[str, Any]: ...
def to_json(
    premise: Premise,
    starts: _Starts,
    memory: _Mem,
    convention: str,
    fifo: bool,
    period: int | None,
    template: list[int] | None,
    repetend: tuple[int, int] | None,
    name: str | None,
    parameter_memory: int,
) -> str: ...
def from_json(text: str) -> dict[str, Any]: ...
def to_tessel_json(premise: Premise, starts: _Starts, repetend: tuple[int, int] | None) -> str: ...
def from_tessel_json(text: str, premise: Premise | None) -> dict[str, Any]: ...
def to_text(premise: Premise, starts: _Starts, repetend: tuple[int, int] | None, compact: bool) -> str: ...
def from_text(text: str, premise: Premise) -> dict[str, Any]: ...
def to_csv(premise: Premise, starts: _Starts) -> str: ...
def orders_to_csv(premise: Premise, orders: list[list[tuple[int, int]]]) -> str: ...
def csv_to_orders(text: str, premise: Premise) -> tuple[int, list[list[tuple[int, int]]]]: ...
def to_svg(
    premise: Premise,
    starts: _Starts,
    memory: _Mem,
    convention: str,
    period: int | None,
    repetend: tuple[int, int] | None,
    show_memory: bool,
    show_repetend: bool,
    title: str | None,
    width: float,
) -> str: ...
def title_line(premise: Premise, starts: _Starts, period: int | None, title: str | None) -> str: ...
def canonical_baseline(name: str) -> str: ...

# The search (rust/maleki-py/src/tessel_search.rs).
def search(
    premise: Premise,
    memory: _Mem,
    nmicros: int,
    convention: str,
    delta_p: int,
    periodic_k: int,
    time_limit: float | None,
    node_budget: int,
    ramp_budget: int,
    transplant_budget: int,
    concat_budget: int,
    exact_jobs: int,
    progress: Any = None,
) -> dict[str, Any]: ...
def exact(
    premise: Premise,
    nmicros: int,
    memory: _Mem,
    convention: str,
    time_limit: float | None,
    node_budget: int,
    progress: Any = None,
) -> dict[str, Any]: ...
def repetends(
    premise: Premise,
    memory: _Mem,
    convention: str,
    delta_p: int,
    time_limit: float | None,
    node_budget: int,
    progress: Any = None,
) -> tuple[int | None, bool, list[tuple[int, int, list[int], list[int] | None, bool, int]]]: ...
