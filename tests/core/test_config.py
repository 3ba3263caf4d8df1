import numpy as np
import pytest

from autockpt_core import Config, ConfigError


def test_defaults_and_units() -> None:
    cfg = Config(dirpath="ckpts", overhead_budget="2%", mtbf="6h", min_interval="30s", max_interval="1h30m")
    assert cfg.overhead_budget == pytest.approx(0.02)
    assert cfg.mtbf == 6 * 3600
    assert cfg.min_interval == 30
    assert cfg.max_interval == 5400
    assert cfg.keep_last == 3 and cfg.async_persist and cfg.resume


@pytest.mark.parametrize(
    ("kwargs", "field", "in_message"),
    [
        ({"overhead_budget": 5}, "overhead_budget", "use 0.05 for 5%"),
        ({"overhead_budget": 2}, "overhead_budget", "use 0.02"),
        ({"overhead_budget": 0}, "overhead_budget", "positive"),
        ({"overhead_budget": -0.1}, "overhead_budget", "positive"),
        ({"overhead_budget": 0.8}, "overhead_budget", "at most 0.5"),
        ({"overhead_budget": "two"}, "overhead_budget", "0.02 or '2%'"),
        ({"overhead_budget": float("nan")}, "overhead_budget", "positive"),
        ({"mtbf": "6 fortnights"}, "mtbf", "'6h'"),
        ({"mtbf": -1}, "mtbf", "must be positive"),
        ({"mtbf": 0}, "mtbf", "must be positive"),
        ({"every_n_steps": 0}, "every_n_steps", "at least 1"),
        ({"every_n_steps": 2.5}, "every_n_steps", "whole number"),
        ({"every_n_steps": True}, "every_n_steps", "whole number"),
        ({"every_n_steps": np.bool_(True)}, "every_n_steps", "whole number"),
        ({"every_n_steps": np.float32(2.5)}, "every_n_steps", "whole number"),
        ({"max_interval": "1h-30m"}, "max_interval", "'30min'"),
        ({"min_interval": "1h", "max_interval": "10min"}, "min_interval", "min_interval <= max_interval"),
        ({"max_interval": "soon"}, "max_interval", "'30min'"),
        ({"every_n_steps": 10, "min_interval": "30s"}, "every_n_steps", "min_interval=30.0 would be ignored"),
        ({"every_n_steps": 10, "max_interval": 60}, "every_n_steps", "drop every_n_steps"),
        (
            {"every_n_steps": 10, "min_interval": 1, "max_interval": 60},
            "every_n_steps",
            "min_interval=1.0 and max_interval=60.0 would be ignored",
        ),
        ({"keep_last": 0}, "keep_last", "at least 1"),
        ({"warmup_steps": -1}, "warmup_steps", "at least 0"),
        ({"profile_window": 1}, "profile_window", "at least 3"),
        ({"async_persist": "maybe"}, "async_persist", "async_persist=True"),
        ({"schedule": "random"}, "schedule", "'uniform'"),
        ({"schedule": "front_loaded"}, "schedule", "set mtbf"),
        ({"dirpath": ""}, "dirpath", "directory"),
    ],
)
def test_bad_values_name_field_value_and_fix(kwargs: dict, field: str, in_message: str) -> None:
    args = {"dirpath": "ckpts", **kwargs}
    with pytest.raises(ConfigError) as info:
        Config(**args)
    message = str(info.value)
    assert info.value.field == field
    assert message.startswith(f"{field}=")
    assert "Fix:" in message
    assert in_message in message


def test_from_dict_unknown_key_suggests_closest() -> None:
    with pytest.raises(ConfigError, match="did you mean 'overhead_budget'"):
        Config.from_dict({"dirpath": "c", "overhead_budgett": 0.02})


def test_from_dict_requires_dirpath() -> None:
    with pytest.raises(ConfigError, match="dirpath=None: is required"):
        Config.from_dict({"overhead_budget": 0.02})


def test_from_yaml_and_toml(tmp_path) -> None:
    y = tmp_path / "a.yaml"
    y.write_text("autockpt:\n  dirpath: ck\n  overhead_budget: 3%\n  mtbf: 12h\n")
    t = tmp_path / "a.toml"
    t.write_text('[autockpt]\ndirpath = "ck"\noverhead_budget = 0.03\nmtbf = "12h"\n')
    assert Config.from_file(y) == Config.from_file(t) == Config(dirpath="ck", overhead_budget=0.03, mtbf=43200)
    assert Config.from_file(y, keep_last=7).keep_last == 7


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.ini", "x=1", "unknown suffix"),
        ("list.yaml", "- 1\n- 2\n", "mapping"),
        ("typo.yaml", "dirpath: c\nkeep_lst: 2\n", "did you mean 'keep_last'"),
    ],
)
def test_from_file_errors(tmp_path, name: str, text: str, match: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        Config.from_file(path)


def test_from_file_missing(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Config.from_file(tmp_path / "nope.yaml")


def test_frozen_and_replace_revalidates() -> None:
    cfg = Config(dirpath="c")
    with pytest.raises(Exception):
        cfg.keep_last = 5  # type: ignore[misc]
    with pytest.raises(ConfigError):
        cfg.replace(keep_last=0)
    assert cfg.replace(keep_last=5).keep_last == 5
    assert Config.from_dict(cfg.to_dict()) == cfg


def test_config_snapshot_mode() -> None:
    assert Config(dirpath="x").snapshot_mode == "auto"
    assert Config(dirpath="x", snapshot_mode="overlap").snapshot_mode == "overlap"
    with pytest.raises(ConfigError, match="snapshot_mode"):
        Config(dirpath="x", snapshot_mode="fast")


def test_storage_options_from_keywords_yaml_and_toml(tmp_path) -> None:
    options = {"endpoint_url": "http://127.0.0.1:9000", "key": "k", "client_kwargs": {"region_name": "eu-west-1"}}
    y = tmp_path / "c.yaml"
    y.write_text("autockpt:\n  dirpath: s3://bucket/run\n  storage_options:\n    endpoint_url: http://127.0.0.1:9000\n"
                 "    key: k\n    client_kwargs: {region_name: eu-west-1}\n")
    t = tmp_path / "c.toml"
    t.write_text('[autockpt]\ndirpath = "s3://bucket/run"\n[autockpt.storage_options]\n'
                 'endpoint_url = "http://127.0.0.1:9000"\nkey = "k"\nclient_kwargs = { region_name = "eu-west-1" }\n')
    given = Config(dirpath="s3://bucket/run", storage_options=options)
    assert Config.from_file(y) == Config.from_file(t) == given
    assert given.storage_options == options and given.storage_options is not options  # a copy


@pytest.mark.parametrize(
    ("kwargs", "field", "value"),
    [
        ({"keep_last": np.int64(3)}, "keep_last", 3),
        ({"every_n_steps": np.int32(7)}, "every_n_steps", 7),
        ({"every_n_steps": np.float64(8.0)}, "every_n_steps", 8),
        ({"warmup_steps": 4.0}, "warmup_steps", 4),
        ({"mtbf": np.float32(3600)}, "mtbf", 3600.0),
        ({"overhead_budget": np.float64(0.05)}, "overhead_budget", 0.05),
    ],
)
def test_integral_and_real_numbers_of_any_type_are_accepted(kwargs: dict, field: str, value: object) -> None:
    got = getattr(Config(dirpath="ckpts", **kwargs), field)
    assert got == pytest.approx(value) and type(got) is type(value)
