"""Cell ids (sha256 of the canonical JSON of a cell's parameters) and the planner's matrix loop.

The loop joins each id's canonical text from pre-rendered `"key":value` fragments and memoises rule verdicts
on the rule parameters: a big plan is several times faster (docs/performance.md; tests/test_plan_fast_path.py
holds it to the plain path, cell_id of every combination).
"""
from __future__ import annotations

import hashlib
import json
from itertools import product
from typing import Callable, Iterator, Optional

from zcorch.config.experiment import Experiment
from zcorch.config.schema import amount_of, writes_bytes
from zcorch.params import CELL_RULE_KEYS, ID_OMIT_AT_DEFAULT, PARAM_KEYS

ID_LENGTH = 12
_RULE_KEYS_SET = frozenset(CELL_RULE_KEYS)   # what the cell rules read (Param.cell_rule): the memo's key
_SORTED_KEYS = sorted(PARAM_KEYS)
_ENCODE = json.JSONEncoder(sort_keys=True, separators=(",", ":")).encode


def canonical(params: dict) -> str:
    """The canonical text a cell id is computed from: every parameter but those of ID_OMIT_AT_DEFAULT
    (zcorch.params) that are at their default."""
    omit = [k for k, d in ID_OMIT_AT_DEFAULT.items() if k in params and params[k] == d]
    if omit:
        params = params.copy()
        for k in omit:
            del params[k]
    return _ENCODE(params)


def cell_id(params: dict) -> str:
    return hashlib.sha256(canonical(params).encode()).hexdigest()[:ID_LENGTH]


def matrix_cells(exp: Experiment, check: Callable[[dict], tuple]) -> Iterator["tuple[str, dict, Optional[int], tuple]"]:
    """Every matrix combination in file order (first axis outermost): (cell id, params, the index of the exclude
    entry that drops it or None, check(params) or () when excluded). `check` must read only CELL_RULE_KEYS."""
    # The last varying axis is the inner loop; everything that depends only on the outer axes (their parameters,
    # the canonical text around the inner key, which exclude entries can still match, the rule verdicts) is
    # worked out once per outer combination.
    base = exp.include_base()            # single-valued axes are constants
    multi = [a for a in exp.matrix if len(a.values) > 1]
    excludes = _compile_excludes(exp, base, multi)
    slot = {k: i for i, k in enumerate(_SORTED_KEYS)}
    template = [_fragment(k, base[k]) for k in _SORTED_KEYS]
    # per axis and value: the parameters it sets and their (slot, fragment) in the canonical text
    # (one of each for a plain axis, several for a linked one)
    sets = [[list(a.assignment(j).items()) for j in range(len(a.values))] for a in multi]
    frags = [[[(slot[k], _fragment(k, v)) for k, v in items] for items in axis_sets] for axis_sets in sets]
    inner = multi[-1] if multi else None
    outer = multi[:-1]
    outer_rule = [i for i, a in enumerate(outer) if set(a.params) & _RULE_KEYS_SET]
    inner_index = len(multi) - 1
    inner_is_rule = inner is not None and bool(set(inner.params) & _RULE_KEYS_SET)
    if inner is None:
        islot, inner_items = None, [(0, (), "")]
    elif not inner.linked:
        islot = slot[inner.key]
        inner_items = [(j, sets[-1][j], frags[-1][j][0][1]) for j in range(len(inner.values))]
    else:  # several slots per value: the canonical text is joined per value
        islot = None
        inner_items = [(j, sets[-1][j], frags[-1][j]) for j in range(len(inner.values))]
    verdicts: dict = {}
    bytes_written = writes_bytes(exp.params, exp.matrix)
    sha256 = hashlib.sha256
    for ocombo in product(*(range(len(a.values)) for a in outer)):
        p0 = base.copy()
        parts = template.copy()
        for i, j in enumerate(ocombo):
            p0.update(sets[i][j])
            for sl, frag in frags[i][j]:
                parts[sl] = frag
        # empty fragments: parameters left out of the id (ID_OMIT_AT_DEFAULT)
        if inner is None or islot is None:
            left, right = "{" + ",".join(f for f in parts if f) + "}", ""
            without = left
        else:
            left = "{" + "".join(f + "," for f in parts[:islot] if f)
            right = "".join("," + f for f in parts[islot + 1:] if f) + "}"
            without = "{" + ",".join(f for i, f in enumerate(parts) if f and i != islot) + "}"
        active = []  # exclude entries whose outer conditions hold: (index, accepted inner indexes or None)
        for e_i, conds in excludes:
            accepted_inner = None
            for ai, accepted in conds:
                if ai == inner_index:
                    accepted_inner = accepted
                elif ocombo[ai] not in accepted:
                    break
            else:
                active.append((e_i, accepted_inner))
        okey = tuple(ocombo[i] for i in outer_rule)
        for j, items, frag in inner_items:
            params = p0.copy()
            params.update(items)
            if islot is None and frag:  # a linked inner axis
                joined = parts.copy()
                for sl, f in frag:
                    joined[sl] = f
                text = "{" + ",".join(f for f in joined if f) + "}"
            else:
                text = left + frag + right if frag else without
            cid = sha256(text.encode()).hexdigest()[:ID_LENGTH]
            if params["duration"] is not None and not bytes_written:  # the default bytes gives way
                params = amount_of(params, bytes_written)
                cid = cell_id(params)
            hit = next((e_i for e_i, acc in active if acc is None or j in acc), None) if active else None
            if hit is not None:
                yield cid, params, hit, ()
                continue
            rk = (okey, j) if inner_is_rule else okey
            verdict = verdicts.get(rk)
            if verdict is None:
                verdict = verdicts[rk] = check(params)
            yield cid, params, None, verdict


def _fragment(key: str, value) -> str:
    """`"key":value` of the canonical text; "" for a parameter left out of it (ID_OMIT_AT_DEFAULT)."""
    if key in ID_OMIT_AT_DEFAULT and value == ID_OMIT_AT_DEFAULT[key]:
        return ""
    return json.dumps(key) + ":" + json.dumps(value)


def _compile_excludes(exp: Experiment, base: dict, axes: list) -> list:
    """Each exclude entry as (index, [(axis index, accepted value indexes)]) over the varying `axes`.

    A key is a parameter (of a plain axis, inside a linked axis, or fixed) or a linked axis's name (its labels).
    Conditions on fixed parameters are decided here against `base`; entries that can never match are left out.
    """
    out = []
    where: "dict[str, tuple[int, Callable[[int], object]]]" = {}  # key -> (axis index, value j -> its value)
    for ai, a in enumerate(axes):
        if a.linked:
            where[a.key] = (ai, lambda j, a=a: a.labels[j])
            for p in a.params:
                where[p] = (ai, lambda j, a=a, p=p: a.values[j][p])
        else:
            where[a.key] = (ai, lambda j, a=a: a.values[j])
    fixed = {a.key: a.labels[0] for a in exp.matrix if a.linked and len(a.values) == 1}
    for e_i, entry in enumerate(exp.exclude):
        conds: "dict[int, frozenset]" = {}
        possible = True
        for key, accepted in entry.items():
            if key in where:
                ai, value_of = where[key]
                ok = frozenset(j for j in range(len(axes[ai].values)) if member(value_of(j), accepted))
                conds[ai] = conds[ai] & ok if ai in conds else ok  # two keys of one linked axis: both hold
            elif not member(fixed[key] if key in fixed else base[key], accepted):
                possible = False  # a fixed parameter that never takes an accepted value
        if possible:
            out.append((e_i, list(conds.items())))
    return out


def member(value, accepted: list) -> bool:
    # `True == 1` in Python: compare types too, so a boolean never matches an integer.
    return any(type(value) is type(a) and value == a for a in accepted)
