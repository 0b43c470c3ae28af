"""What a sweep sets up between its runs (switch_keys: the learner and the estimate name each gap the same way),
and what an earlier sweep took to do it (Timings, for the plan's estimate).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Timings:
    """What an earlier result set took; setup: seconds of each gap beyond a plain run, by switch_keys."""
    source: str
    rate: Optional[float]            # bytes/s of its transfers (None: every cell ran for a duration)
    per_run: float                   # seconds between one run's end and the next one's start
    setup: "dict[str, float]"
    before: float                    # the start to the first run: hosts, deploy, calibration, baselines
    after: float                     # the last run's end to the finish: teardown
    first: "tuple[str, ...]" = ()    # the configuration of its first run (its set-up is in `before`)

    def cost(self, key: str) -> float:
        """A switch's seconds: learned, else the median of the learned ones of its kind (0 without)."""
        if key in self.setup:
            return self.setup[key]
        kind = key.split("=", 1)[0]
        alike = sorted(v for k, v in self.setup.items() if k.split("=", 1)[0] == kind)
        return alike[len(alike) // 2] if alike else 0.0


def switch_keys(params: "Sequence[dict]") -> "list[str]":
    """For runs in order, the set-up before each one ("" none): "filesystem=X" its first use (kept until its last
    run), "release filesystem=X" the run after X's last one, "network=Y" a change of network."""
    last = {p.get("filesystem"): i for i, p in enumerate(params) if p.get("filesystem")}
    keys, seen = [], set()
    for i, p in enumerate(params):
        fs, prev = p.get("filesystem"), params[i - 1] if i else {}
        if i and fs and fs not in seen:
            keys.append(f"filesystem={fs}")
        elif i and p.get("network") != prev.get("network"):
            keys.append(f"network={p.get('network')}")
        elif i and prev.get("filesystem") and last.get(prev.get("filesystem")) == i - 1:
            keys.append(f"release filesystem={prev.get('filesystem')}")
        else:
            keys.append("")
        seen.add(fs)
    return keys
