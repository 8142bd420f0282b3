"""Type stubs of the compiled module ``maleki_rs._core`` (private; use the package API)."""

from typing import Any

from . import msgemm as msgemm

__version__: str

def set_num_threads(n: int) -> None: ...
def get_num_threads() -> int: ...
def build_info() -> dict[str, Any]: ...

from . import pose as pose
from . import tessel as tessel
