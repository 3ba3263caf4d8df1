"""Walking nested state (dicts, lists, tuples) and replacing tensor leaves.

Used by the adapters to copy every tensor of a framework's state into reusable host buffers
while keeping the structure (and container types such as OrderedDict) intact.
"""

from __future__ import annotations

import copy
from typing import Any, Callable


def map_tree(
    obj: Any,
    is_leaf: Callable[[Any], bool],
    leaf_fn: Callable[[str, Any], Any],
    other_fn: Callable[[Any], Any] | None = None,
    path: str = "",
) -> Any:
    """Return a copy of ``obj`` with ``leaf_fn(path, leaf)`` applied to every leaf.

    Dicts keep their type (OrderedDict, defaultdict), lists become lists, tuples and namedtuples
    keep their type. A list or plain tuple of more than 8 plain scalars (exact types int, float,
    str, bool, bytes, complex, None) is copied whole without visiting its items, so such
    scalars are never passed to ``is_leaf`` there. Values that are neither containers nor leaves go through ``other_fn``
    (default: a deep copy, so the snapshot never aliases live training state). Paths are
    "/"-joined keys and indices, e.g. ``"state_dict/layer.weight"``.
    """
    other = other_fn or _detached_copy
    if is_leaf(obj):
        return leaf_fn(path, obj)
    if isinstance(obj, dict):
        out = copy.copy(obj)
        for key, value in obj.items():
            out[key] = map_tree(value, is_leaf, leaf_fn, other_fn, _join(path, key))
        return out
    if type(obj) in (list, tuple) and len(obj) > 8 and set(map(type, obj)) <= _SCALARS:
        # Fast path for long runs of plain scalars (RNG states hold 600+ ints): they are
        # never leaves here, and immutable values need no deep copy.
        return list(obj) if type(obj) is list else obj
    if isinstance(obj, list):
        return [map_tree(v, is_leaf, leaf_fn, other_fn, _join(path, i)) for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        items = [map_tree(v, is_leaf, leaf_fn, other_fn, _join(path, i)) for i, v in enumerate(obj)]
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items) if type(obj) is not tuple else tuple(items)
    return other(obj)


def iter_leaves(obj: Any, is_leaf: Callable[[Any], bool], path: str = "") -> list[tuple[str, Any]]:
    """All ``(path, leaf)`` pairs in ``obj``, in the order ``map_tree`` visits them."""
    found: list[tuple[str, Any]] = []

    def collect(p: str, leaf: Any) -> Any:
        found.append((p, leaf))
        return leaf

    map_tree(obj, is_leaf, collect, other_fn=lambda x: x, path=path)
    return found


_SCALARS = frozenset({bool, int, float, complex, str, bytes, type(None)})


def _join(path: str, key: Any) -> str:
    return f"{path}/{key}" if path else str(key)


def _detached_copy(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, complex, str, bytes)):
        return value
    try:
        return copy.deepcopy(value)
    except Exception:  # an uncopyable object (a lock, a handle): keep the reference
        return value
