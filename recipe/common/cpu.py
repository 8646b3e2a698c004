"""What this CPU computes natively, read once for both engines' dtype decisions."""

from __future__ import annotations

from functools import cache
from pathlib import Path


@cache
def cpu_has_bf16() -> bool:
    """True when the CPU has bf16 arithmetic (the ``avx512_bf16`` or ``amx_bf16`` flag of ``/proc/cpuinfo``): the
    condition for bf16 autocast on a CPU. Without it torch emulates bf16 matmuls, slower than float32."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
