"""Plain-text tables for the terminal (`zcorch plan`, the end-of-run summary of `zcorch run`)."""
from __future__ import annotations

from typing import List, Sequence


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """Lines of an aligned table: the first column right-aligned, the others left-aligned."""
    widths = [max(len(header[i]), *(len(r[i]) for r in rows)) if rows else len(header[i])
              for i in range(len(header))]
    fmt = "  ".join(f"{{:{'>' if i == 0 else '<'}{w}}}" for i, w in enumerate(widths))
    return [fmt.format(*header).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]
