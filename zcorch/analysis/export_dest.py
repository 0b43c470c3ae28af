"""Where a result dataset may be written (`zcorch export ROOT DEST`, `zcorch run ... --export DEST`): a real
directory, not a symbolic link (nothing is written through one), empty or already a zcorch dataset. Without
pandas or pyarrow, so that `zcorch run --export DEST` refuses a DEST the export would refuse before its sweep
starts rather than after it ends (zcorch.analysis.export writes the dataset)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

MANIFEST = "dataset.json"   # the dataset's manifest (zcorch.analysis.dataset reads and writes it)


def dest_problem(dest: "str | os.PathLike") -> Optional[str]:
    """Why DEST cannot receive a dataset, or None (a missing DEST is made by the export)."""
    dest = Path(dest)
    if dest.is_symlink():
        return (f"{dest}: a symbolic link: the dataset is never written through a link (name the directory it "
                "points to)")
    if dest.exists() and not dest.is_dir():
        return f"{dest}: not a directory"
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MANIFEST).exists():
        return f"{dest}: not empty and not a zcorch dataset (no {MANIFEST}): refusing to write into it"
    return None
