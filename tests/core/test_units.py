import numpy as np
import pytest

from autockpt_core.units import format_duration, format_size, parse_duration, parse_fraction, parse_size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        (5, 5.0),
        (0.25, 0.25),
        ("350ms", 0.35),
        ("2s", 2.0),
        ("1.5 min", 90.0),
        ("6h", 21600.0),
        ("1d", 86400.0),
        ("1h30m", 5400.0),
        ("120", 120.0),
        ("500us", 0.0005),
        (np.float32(2.5), 2.5),
        (np.int64(3), 3.0),
    ],
)
def test_parse_duration(text, seconds) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "abc", "6 parsecs", "h6", True, "1h-30m", "1h+30m", "2h -5m", np.bool_(True), None])
def test_parse_duration_rejects(text) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("text", "value"), [("2%", 0.02), ("0.05", 0.05), (0.1, 0.1), ("12.5%", 0.125), (np.float64(0.03), 0.03)]
)
def test_parse_fraction(text, value) -> None:
    assert parse_fraction(text) == pytest.approx(value)


@pytest.mark.parametrize(("text", "value"), [("1.5GB", 1_500_000_000), ("4GiB", 4 * 2**30), (10, 10), ("512kb", 512_000)])
def test_parse_size(text, value) -> None:
    assert parse_size(text) == value


def test_parse_size_rejects_unknown_unit() -> None:
    with pytest.raises(ValueError, match="unknown size unit"):
        parse_size("3 furlongs")


@pytest.mark.parametrize(
    ("seconds", "text"), [(0.35, "350ms"), (12.5, "12.5s"), (600, "10.0min"), (21600, "6.0h"), (2e-5, "20us")]
)
def test_format_duration(seconds, text) -> None:
    assert format_duration(seconds) == text


def test_format_size() -> None:
    assert format_size(6_800_000) == "6.8MB"
    assert format_size(512) == "512B"
