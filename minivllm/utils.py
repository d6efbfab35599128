"""Small helpers shared across layers."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division."""
    return -(a // -b)
