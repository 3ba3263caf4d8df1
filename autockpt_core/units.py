"""Parsing of human units: durations ("350ms", "6h"), fractions ("2%"), sizes ("1.5GB")."""

from __future__ import annotations

import math
import numbers
import re

_DURATION_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "secs": 1.0,
    "second": 1.0,
    "seconds": 1.0,
    "m": 60.0,
    "min": 60.0,
    "mins": 60.0,
    "minute": 60.0,
    "minutes": 60.0,
    "h": 3600.0,
    "hr": 3600.0,
    "hrs": 3600.0,
    "hour": 3600.0,
    "hours": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
    "days": 86400.0,
}

_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

_NUMBER_UNIT = re.compile(r"^\s*([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([a-zA-Zµ%]*)\s*$")


def _split(text: str) -> tuple[float, str]:
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ValueError(f"cannot read {text!r} as a number with an optional unit")
    return float(match.group(1)), match.group(2)


def parse_duration(value: float | int | str) -> float:
    """Return seconds for a number (already seconds) or a string such as "350ms", "6h", "1.5 days".

    Compound forms like "1h30m" are accepted. Raises ``ValueError`` for anything else.
    """
    if isinstance(value, bool):
        raise ValueError(f"a duration cannot be a boolean ({value!r})")
    if isinstance(value, numbers.Real):
        seconds = float(value)
    elif not isinstance(value, str):
        raise ValueError(f"cannot read {value!r} as a duration; use seconds or e.g. '350ms', '6h', '1h30m'")
    else:
        text = value.strip().lower()
        parts = re.findall(r"([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?)\s*([a-zµ]*)", text)
        joined = "".join(n + u for n, u in parts)
        if not parts or joined != re.sub(r"\s+", "", text) or any(n[0] in "+-" for n, _u in parts[1:]):
            # a sign inside a compound ("1h-30m") is not a duration anyone means: refused
            raise ValueError(f"cannot read {value!r} as a duration; use seconds or e.g. '350ms', '6h', '1h30m'")
        seconds = 0.0
        for number, unit in parts:
            if unit and unit not in _DURATION_UNITS:
                raise ValueError(
                    f"unknown time unit {unit!r} in {value!r}; use one of ms, s, min, h, d"
                )
            seconds += float(number) * _DURATION_UNITS.get(unit, 1.0)
    if not math.isfinite(seconds):
        raise ValueError(f"a duration must be finite, got {value!r}")
    return seconds


def parse_fraction(value: float | int | str) -> float:
    """Return a fraction for a number (already a fraction) or a string like "2%" or "0.02"."""
    if isinstance(value, bool):
        raise ValueError(f"a fraction cannot be a boolean ({value!r})")
    if isinstance(value, numbers.Real):
        return float(value)
    number, unit = _split(value)
    if unit == "%":
        return number / 100.0
    if unit:
        raise ValueError(f"cannot read {value!r} as a fraction; use e.g. 0.02 or '2%'")
    return number


def parse_size(value: float | int | str) -> int:
    """Return bytes for a number (already bytes) or a string like "512MB" or "4GiB"."""
    if isinstance(value, bool):
        raise ValueError(f"a size cannot be a boolean ({value!r})")
    if isinstance(value, (int, float)):
        return int(value)
    number, unit = _split(value)
    factor = _SIZE_UNITS.get(unit.lower() or "b")
    if factor is None:
        raise ValueError(f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, GB, MiB, GiB")
    return int(number * factor)


def format_duration(seconds: float) -> str:
    """Short human form: 350ms, 12.5s, 4.2min, 6.0h."""
    if seconds < 1.0:
        return f"{seconds * 1e3:.0f}ms" if seconds >= 1e-3 else f"{seconds * 1e6:.0f}us"
    if seconds < 120.0:
        return f"{seconds:.1f}s"
    if seconds < 7200.0:
        return f"{seconds / 60.0:.1f}min"
    return f"{seconds / 3600.0:.1f}h"


def format_size(nbytes: float) -> str:
    """Short human form in decimal units: 6.8MB, 1.2GB."""
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f}{unit}"
    return f"{nbytes:.0f}B"
