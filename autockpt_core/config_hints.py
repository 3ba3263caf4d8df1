"""What a setting no one takes, or one that another makes useless, tells the user.

Used where settings come in: :meth:`autockpt_core.Config.from_dict` (YAML and TOML files) and
the callbacks' keywords (:mod:`autockpt_core.callback_settings`), so a misspelt name gets the
same answer everywhere. Construction only, on the caller's thread.
"""

from __future__ import annotations

import difflib
import warnings
from typing import Any, Mapping, Sequence

from .errors import ConfigError


def unknown_setting(name: str, value: Any, known: Sequence[str], problem: str) -> ConfigError:
    """The error for a setting no one takes: the closest known name, else all of them."""
    close = difflib.get_close_matches(name, list(known), n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known)}"
    return ConfigError(name, value, problem, fix)


def warn_ignored_with_every_n_steps(given: Mapping[str, Any], stacklevel: int) -> None:
    """``every_n_steps`` fixes the interval: warn that the budget and the MTBF given with it are
    not used to choose one (``given``: the settings the user wrote; ``stacklevel``: the user's
    frame, counted from the caller)."""
    if given.get("every_n_steps") is None:
        return
    ignored = [f"{name}={given[name]!r}" for name in ("overhead_budget", "mtbf") if given.get(name) is not None]
    if ignored:
        warnings.warn(
            f"autockpt: every_n_steps={given['every_n_steps']!r} fixes the checkpoint interval, so "
            f"{' and '.join(ignored)} {'is' if len(ignored) == 1 else 'are'} not used to choose it; "
            "drop every_n_steps to let the policy choose, or drop the others",
            UserWarning,
            stacklevel=stacklevel + 1,
        )
