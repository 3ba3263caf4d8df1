"""The keywords both adapters' ``AutoCheckpoint`` take, written once.

:class:`CallbackSettings` is the first base of ``autockpt_lightning.AutoCheckpoint`` and
``autockpt_keras.AutoCheckpoint``: its ``__init__`` declares every keyword (so IDEs and
LightningCLI see one explicit signature), validates them into ``self.config`` (a bad value is
a ``ConfigError`` naming the field, at construction), keeps ``save_on_train_end`` and
``storage``, calls the framework's own callback ``__init__`` and then the adapter's
:meth:`~CallbackSettings._init_adapter`. :meth:`~CallbackSettings.from_config` builds one from
a YAML or TOML file. Call order: construction only, on the thread that builds the callback.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from pathlib import Path
from typing import Any, Callable, Collection, Mapping, TypeVar, cast

from .config import Config
from .config_hints import unknown_setting, warn_ignored_with_every_n_steps
from .errors import ConfigError
from .persist.storage import Storage

#: Every field's default, for adapters whose constructors mirror the Config fields as keywords.
CONFIG_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(Config) if f.default is not dataclasses.MISSING
}


def config_from_keywords(
    dirpath: str | os.PathLike[str] | None,
    config: Config | None,
    keywords: Mapping[str, Any],
    explicit: Collection[str],
) -> Config:
    """The Config an adapter's ``AutoCheckpoint(dirpath, config=..., **keywords)`` asks for.

    Without ``config``: ``Config(dirpath, **keywords)``. With it: ``config`` with the keywords
    the caller passed (``explicit``, from :func:`records_explicit_keywords`) and ``dirpath``,
    if given, applied on top. Keywords that are not Config fields are ignored (adapters pass
    only their mirrored fields).
    """
    values = {k: v for k, v in keywords.items() if k in CONFIG_DEFAULTS}
    if config is None:
        warn_ignored_with_every_n_steps({k: v for k, v in values.items() if k in explicit}, stacklevel=4)
        if dirpath is None:
            raise ConfigError("dirpath", None, "is required", "pass AutoCheckpoint(dirpath='ckpts') or config=Config(...)")
        return Config(dirpath=os.fspath(dirpath), **values)
    if not isinstance(config, Config):
        raise ConfigError(
            "config", config, "is not an autockpt Config",
            "pass autockpt_core.Config(...) or use AutoCheckpoint.from_config(path)",
        )
    warn_ignored_with_every_n_steps({k: v for k, v in values.items() if k in explicit}, stacklevel=4)
    # keep_last=3 overrides config.keep_last=5 even though 3 is the default
    changed = {k: v for k, v in values.items() if k in explicit}
    if dirpath is not None:
        changed["dirpath"] = os.fspath(dirpath)
    return config.replace(**changed) if changed else config


_Init = TypeVar("_Init", bound=Callable[..., None])


def records_explicit_keywords(init: _Init) -> _Init:
    """Decorate an adapter's ``__init__``: ``self._explicit_keywords`` = the keywords passed.

    So ``AutoCheckpoint(config=cfg, keep_last=3)`` can tell a keyword the user wrote from one
    left at its default. A keyword ``__init__`` does not take is a ``ConfigError`` naming it
    with the closest one (as a misspelt key in a YAML file is), not Python's ``TypeError``.
    ``functools.wraps`` keeps the signature visible to IDEs and LightningCLI
    (``inspect.signature`` follows ``__wrapped__``).
    """
    known = [name for name in inspect.signature(init).parameters if name != "self"]

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        for name in kwargs:
            if name not in known:
                raise unknown_setting(name, kwargs[name], known, f"is not a keyword of {type(self).__name__}")
        self._explicit_keywords = frozenset(kwargs)
        init(self, *args, **kwargs)

    return cast(_Init, wrapper)


_D = CONFIG_DEFAULTS
CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(Config))

_Settings = TypeVar("_Settings", bound="CallbackSettings")


class CallbackSettings:
    """What every ``AutoCheckpoint`` is configured with.

    Every keyword but the last three is a field of :class:`~autockpt_core.Config`, with the
    same default and meaning (documented there, once). Alternatively pass a built ``config``;
    then the keywords given explicitly (and ``dirpath``) override it.

    ``save_on_train_end`` (default True): take a final checkpoint when ``fit()`` returns
    normally and the state advanced since the newest one (skipped, with a warning, after a
    non-finite loss). ``storage`` replaces the storage ``dirpath`` would select (tests, custom
    backends).
    """

    _explicit_keywords: frozenset[str] = frozenset()  # set by records_explicit_keywords

    @records_explicit_keywords
    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        *,
        overhead_budget: float | str = _D["overhead_budget"],
        mtbf: float | str | None = _D["mtbf"],
        every_n_steps: int | None = _D["every_n_steps"],
        min_interval: float | str | None = _D["min_interval"],
        max_interval: float | str | None = _D["max_interval"],
        keep_last: int = _D["keep_last"],
        warmup_steps: int = _D["warmup_steps"],
        profile_window: int = _D["profile_window"],
        async_persist: bool = _D["async_persist"],
        resume: bool = _D["resume"],
        schedule: str = _D["schedule"],
        adaptive: bool = _D["adaptive"],
        verbose: bool = _D["verbose"],
        total_steps: int | None = _D.get("total_steps"),
        signals: tuple[str, ...] = _D["signals"],
        on_preempt: str = _D["on_preempt"],
        snapshot_mode: str = _D["snapshot_mode"],
        persist_mode: str = _D["persist_mode"],
        storage_options: dict[str, Any] | None = _D["storage_options"],
        mirror: str | None = _D["mirror"],
        mirror_keep_last: int | None = _D["mirror_keep_last"],
        mirror_max_failures: int | None = _D["mirror_max_failures"],
        mirror_max_outage: float | str = _D["mirror_max_outage"],
        mirror_stall_timeout: float | str = _D["mirror_stall_timeout"],
        mirror_preempt_wait: float | str | None = _D["mirror_preempt_wait"],
        mirror_takeover: bool = _D["mirror_takeover"],
        allow_pickle: bool = _D["allow_pickle"],
        status_file: bool = _D["status_file"],
        log_metrics: bool | None = _D["log_metrics"],
        grace_period: float | str = _D["grace_period"],
        deadline: float | str | None = _D["deadline"],
        preemption_notice: str | None = _D["preemption_notice"],
        notice_poll_interval: float | str = _D["notice_poll_interval"],
        config: Config | None = None,
        save_on_train_end: bool = True,
        storage: Storage | None = None,
    ) -> None:
        values = {name: value for name, value in locals().items() if name in CONFIG_DEFAULTS}
        self.config: Config = config_from_keywords(dirpath, config, values, self._explicit_keywords)
        self.save_on_train_end = bool(save_on_train_end)
        self._storage = storage
        super().__init__()  # the framework's Callback
        self._init_adapter()

    def _init_adapter(self) -> None:
        """The adapter's own state, set up right after the settings (no arguments)."""

    @classmethod
    def from_config(cls: type[_Settings], path: str | os.PathLike[str] | Path, **overrides: Any) -> _Settings:
        """Build from a YAML or TOML file (:meth:`Config.from_file`); ``overrides`` win over it.

        Overrides that are not Config fields (``save_on_train_end``, ``storage``) go to the
        constructor.
        """
        config_overrides = {k: v for k, v in overrides.items() if k in CONFIG_FIELDS}
        extra = {k: v for k, v in overrides.items() if k not in CONFIG_FIELDS}
        return cls(config=Config.from_file(path, **config_overrides), **extra)
