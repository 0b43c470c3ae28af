"""Where a result dataset may be written: a real directory (no link), empty or already a zcorch dataset. Without
pandas or pyarrow, so that `zcorch run --export DEST` refuses a bad DEST before its sweep starts."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

MANIFEST = "dataset.json"   # the dataset's manifest (zcorch.analysis.dataset reads and writes it)
LOCK = ".export.lock"       # flock()ed by the export writing the dataset (zcorch.analysis.export)
TABLES = ("sets", "runs", "baselines", "hosts")   # a directory of partitioned part files each
_PART = re.compile(r"(part-[0-9T]+-[0-9a-f]+\.parquet|\.part-[0-9T]+-[0-9a-f]+\.parquet\.[0-9a-f]+\.tmp)")
MANIFEST_TMP = re.compile(r"\.dataset\.json\.[0-9a-f]+\.tmp")   # MANIFEST being written (setfiles.write_inside)
PARTITIONS = ("experiment", "date")   # hive partitions of every table: TABLE/experiment=E/date=D/part-*.parquet
_PARTITION = tuple(re.compile(re.escape(p) + "=.+") for p in PARTITIONS)


def dest_problem(dest: "str | os.PathLike") -> Optional[str]:
    """Why DEST cannot receive a dataset, or None (a missing DEST is made by the export)."""
    dest = Path(dest)
    if dest.is_symlink():
        return (f"{dest}: a symbolic link: the dataset is never written through a link (name the directory it "
                "points to)")
    if dest.exists() and not dest.is_dir():
        return f"{dest}: not a directory"
    if dest.is_dir() and any(dest.iterdir()) and not (dest / MANIFEST).exists() and not dead_first_export(dest):
        return f"{dest}: not empty and not a zcorch dataset (no {MANIFEST}): refusing to write into it"
    return None


def dead_first_export(dest: Path) -> bool:
    """Whether DEST holds exactly what a first export that died before its MANIFEST leaves: the lock, perhaps
    MANIFEST's temporary, and tables of partitions of part files and temporaries. Anything else is somebody's."""
    lock = dest / LOCK
    if lock.is_symlink() or not lock.is_file():
        return False
    for entry in dest.iterdir():
        if entry.name == LOCK or (MANIFEST_TMP.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink()):
            continue
        if entry.name not in TABLES or entry.is_symlink() or not entry.is_dir():
            return False
        for dirpath, dirnames, filenames in os.walk(entry):   # follows no directory link
            depth = len(Path(dirpath).relative_to(entry).parts)
            if depth < len(_PARTITION):
                if filenames or any(os.path.islink(os.path.join(dirpath, d)) or not _PARTITION[depth].fullmatch(d)
                                    for d in dirnames):
                    return False
            elif dirnames or not all(_PART.fullmatch(f) and not os.path.islink(os.path.join(dirpath, f))
                                     for f in filenames):
                return False
    return True
