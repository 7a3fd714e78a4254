"""Parsing a sweep request: grid values, keys, fixed parameters, sampled points, sweep ids, a failed
point's error line."""

from __future__ import annotations

import itertools
import random
import re
import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pipelines.core.sweep.base import _CLOSE, _KEY, _OPEN, _SWEEP_ID, GridError


def split_top_level(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets (``[] {} ()``) and quotes: ``[0,1],[2]`` -> ``['[0,1]', '[2]']``."""
    parts: list[str] = []
    cur: list[str] = []
    stack: list[str] = []
    quote: str | None = None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in _OPEN:
            stack.append(_CLOSE[_OPEN.index(ch)])
        elif ch in _CLOSE:
            if not stack or stack.pop() != ch:
                raise GridError(f"unbalanced {ch!r} in {text!r}")
        elif ch == sep and not stack:
            parts.append("".join(cur).strip())
            cur = []
            continue
        cur.append(ch)
    if quote:
        raise GridError(f"unclosed quote {quote} in {text!r}")
    if stack:
        raise GridError(f"unclosed bracket (expected {stack[-1]!r}) in {text!r}")
    parts.append("".join(cur).strip())
    return parts


def parse_value(text: str) -> Any:
    """A value as YAML: ``[0]`` a list, ``0.6`` a float, ``true`` a bool, ``abc`` a string."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise GridError(f"value {text!r} is not valid YAML ({first})") from None


def _check_key(key: str, where: str) -> str:
    if not _KEY.match(key):
        raise GridError(f"{where}: {key!r} is not a parameter key (dotted, e.g. rankcal.ece.n_bins)")
    return key


def parse_grid(spec: str) -> tuple[str, list[str]]:
    """``"rankcal.seeds=[0],[1]"`` -> ``("rankcal.seeds", ["[0]", "[1]"])`` (values as written)."""
    key, eq, rest = spec.partition("=")
    key = key.strip()
    if not eq or not key:
        raise GridError(f"--grid {spec!r}: expected key=value1,value2,...")
    _check_key(key, "--grid")
    try:
        values = split_top_level(rest)
    except GridError as exc:
        raise GridError(f"--grid {key}: {exc}") from None
    if any(v == "" for v in values):
        raise GridError(f"--grid {key}: empty value in {rest!r}")
    seen = set()
    for v in values:
        if v in seen:
            raise GridError(f"--grid {key}: value {v!r} is given twice")
        seen.add(v)
        try:
            parse_value(v)
        except GridError as exc:
            raise GridError(f"--grid {key}: {exc}") from None
    return key, values


def parse_assignments(text: str | None, option: str) -> dict[str, str]:
    """``"a.b=1,c=[1,2]"`` -> ``{"a.b": "1", "c": "[1,2]"}`` (values as written, checked as YAML)."""
    out: dict[str, str] = {}
    if not text:
        return out
    try:
        items = split_top_level(text)
    except GridError as exc:
        raise GridError(f"{option}: {exc}") from None
    for item in items:
        if not item:
            continue
        key, eq, val = item.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or not key:
            raise GridError(f"{option}: {item!r} must be key=value")
        _check_key(key, option)
        try:
            parse_value(val)
        except GridError as exc:
            raise GridError(f"{option} {key}: {exc}") from None
        out[key] = val
    return out


def expand_grid(grids: Sequence[tuple[str, Sequence[str]]]) -> list[dict[str, str]]:
    """The Cartesian product of the grids, first grid slowest: a list of ``{key: value as written}``."""
    keys = [k for k, _ in grids]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise GridError(f"--grid {dup[0]} is given more than once; list all its values in one --grid")
    return [dict(zip(keys, combo)) for combo in itertools.product(*(vals for _, vals in grids))]


def sample_points(n_points: int, n: int | None, seed: int) -> list[int]:
    """Indices of a reproducible random subset of ``n`` points (all of them if ``n`` is None or >= n_points),
    in grid order."""
    if n is None or n >= n_points:
        return list(range(n_points))
    return sorted(random.Random(seed).sample(range(n_points), n))


def new_sweep_id(pipeline: str, now: datetime | None = None) -> str:
    """``<m>-<UTC yyyymmddThhmmss>-<4 hex>``."""
    now = now or datetime.now(UTC)
    return f"{pipeline}-{now.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"


def pipeline_of(sweep_id: str) -> str:
    m = _SWEEP_ID.match(sweep_id)
    if not m:
        raise GridError(f"{sweep_id!r} is not a sweep id (<pipeline>-<yyyymmddThhmmss>-<4 hex>)")
    return m.group("m")


def error_line(stderr: str, returncode: int) -> str:
    """The one line that says why a point failed: the last ``Error: ...`` line of its stderr, else the
    last ``SomethingError: ...`` line (a traceback's end), else the last non-empty line."""
    lines = [ln.strip() for ln in (stderr or "").splitlines()]
    lines = [ln for ln in lines if ln and not re.match(r"^[\u2500-\u257f\s]+$", ln)]  # no box rules
    pick = next((ln for ln in reversed(lines) if ln.startswith("Error:")), None)
    if pick is None:
        pick = next(
            (ln for ln in reversed(lines) if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b", ln)), None
        )
    if pick is None:
        pick = next((ln for ln in reversed(lines) if ln[0] not in "\u2502\u2570\u256d"), None)
    pick = pick or f"exit code {returncode}"
    return pick if len(pick) <= 400 else pick[:397] + "..."
