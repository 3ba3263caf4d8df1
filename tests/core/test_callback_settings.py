"""The keywords both ``AutoCheckpoint`` callbacks take, written once (``CallbackSettings``):
checked on a framework-free subclass, then on both adapters (same signature, same
``from_config``; Lightning's used to refuse ``save_on_train_end`` there)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from autockpt_core import Config, ConfigError
from autockpt_core.callback_settings import CallbackSettings


class Recording(CallbackSettings):
    def _init_adapter(self) -> None:
        self.adapter_saw = self.config.keep_last


def adapters() -> list[Any]:
    from autockpt_keras import AutoCheckpoint as KerasAutoCheckpoint
    from autockpt_lightning import AutoCheckpoint as LightningAutoCheckpoint

    return [LightningAutoCheckpoint, KerasAutoCheckpoint]


@pytest.mark.parametrize(
    ("args", "kwargs", "keep_last", "dirpath"),
    [
        (("ck",), {}, 3, "ck"),
        (("ck",), {"keep_last": 5}, 5, "ck"),
        ((), {"config": Config(dirpath="a", keep_last=7)}, 7, "a"),
        ((), {"config": Config(dirpath="a", keep_last=7), "keep_last": 3}, 3, "a"),  # explicit, though the default
        (("b",), {"config": Config(dirpath="a", keep_last=7)}, 7, "b"),
    ],
)
def test_keywords_build_the_config_and_the_adapter_sees_it(
    args: tuple[Any, ...], kwargs: dict[str, Any], keep_last: int, dirpath: str
) -> None:
    settings = Recording(*args, **kwargs)
    assert settings.config.keep_last == settings.adapter_saw == keep_last and settings.config.dirpath == dirpath


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({}, "dirpath"), ({"dirpath": "ck", "keep_last": 0}, "keep_last"), ({"config": "ck.yaml"}, "config")],
)
def test_bad_settings_name_the_field_at_construction(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        Recording(**kwargs)
    assert info.value.field == field


def test_from_config_sends_other_keywords_to_the_constructor(tmp_path: Path) -> None:
    path = tmp_path / "autockpt.yaml"
    path.write_text("dirpath: ck\nkeep_last: 4\n")
    settings = Recording.from_config(path, every_n_steps=9, save_on_train_end=False)
    assert (settings.config.keep_last, settings.config.every_n_steps, settings.save_on_train_end) == (4, 9, False)


@pytest.mark.integration
def test_both_callbacks_take_the_same_keywords_and_read_files_the_same_way(tmp_path: Path) -> None:
    lightning, keras = adapters()
    signature = inspect.signature(CallbackSettings.__init__)
    assert inspect.signature(lightning.__init__) == inspect.signature(keras.__init__) == signature
    path = tmp_path / "autockpt.toml"
    path.write_text('dirpath = "ck"\nkeep_last = 2\n')
    for adapter in (lightning, keras):
        callback = adapter.from_config(path, save_on_train_end=False, every_n_steps=4)
        assert (callback.config.keep_last, callback.config.every_n_steps) == (2, 4)
        assert callback.save_on_train_end is False and callback.events == []


@pytest.mark.parametrize(
    ("keyword", "suggested"),
    [("overhead_budjet", "overhead_budget"), ("dirpaht", "dirpath"), ("keeplast", "keep_last"), ("zzz", None)],
)
def test_a_misspelt_keyword_is_a_config_error_with_the_closest_name(keyword: str, suggested: str | None) -> None:
    """The same answer a misspelt key in a YAML file gets (``Config.from_dict``), in both callbacks."""
    for cls in [Recording, *adapters()]:
        with pytest.raises(ConfigError) as info:
            cls("ck", **{keyword: 0.02})
        message = str(info.value)
        assert info.value.field == keyword and f"is not a keyword of {cls.__name__}" in message
        assert (f"did you mean {suggested!r}?" in message) if suggested else ("known: dirpath, overhead_budget" in message)


@pytest.mark.parametrize(
    ("given", "warned"),
    [
        ({"every_n_steps": 10, "overhead_budget": 0.05}, "overhead_budget=0.05 is not used"),
        ({"every_n_steps": 10, "mtbf": "6h", "overhead_budget": "5%"}, "overhead_budget='5%' and mtbf='6h' are not used"),
        ({"every_n_steps": 10}, None),
        ({"overhead_budget": 0.05, "mtbf": "6h"}, None),
    ],
)
def test_every_n_steps_warns_that_the_budget_given_with_it_is_not_used(given: dict[str, Any], warned: str | None) -> None:
    import warnings

    builds = [lambda: Recording("ck", **given), lambda: Config.from_dict({"dirpath": "ck", **given})]
    for build in builds:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            build()
        messages = [(str(w.message), w.filename) for w in caught if "fixes the checkpoint interval" in str(w.message)]
        if warned is None:
            assert messages == []
        else:
            assert len(messages) == 1 and warned in messages[0][0] and messages[0][1] == __file__, messages
