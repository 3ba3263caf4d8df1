import random
from collections import OrderedDict, defaultdict, namedtuple

import numpy as np

from autockpt_core.persist.tree import iter_leaves, map_tree

Pair = namedtuple("Pair", "x y")


def is_array(x) -> bool:
    return isinstance(x, np.ndarray)


def test_map_tree_keeps_structure_and_types() -> None:
    dd = defaultdict(list, {"k": np.zeros(2)})
    tree = {
        "od": OrderedDict([("w", np.ones(3)), ("n", 4)]),
        "lst": [np.zeros(1), "s", (np.ones(1), 2)],
        "pair": Pair(np.ones(1), None),
        "dd": dd,
        "meta": {"nested": [1, 2]},
    }
    out = map_tree(tree, is_array, lambda path, a: path)
    assert isinstance(out["od"], OrderedDict) and out["od"]["w"] == "od/w" and out["od"]["n"] == 4
    assert out["lst"] == ["lst/0", "s", ("lst/2/0", 2)]
    assert isinstance(out["pair"], Pair) and out["pair"].x == "pair/0" and out["pair"].y is None
    assert isinstance(out["dd"], defaultdict) and out["dd"].default_factory is list
    assert out["meta"] == {"nested": [1, 2]} and out["meta"] is not tree["meta"]
    assert out["meta"]["nested"] is not tree["meta"]["nested"]  # deep-copied, not aliased


def test_iter_leaves_order_matches_map_tree() -> None:
    tree = {"b": np.ones(1), "a": [np.zeros(2), {"c": np.ones(3)}]}
    assert [p for p, _ in iter_leaves(tree, is_array)] == ["b", "a/0", "a/1/c"]


def test_map_tree_copies_long_scalar_runs_whole() -> None:
    state = {"rng": random.getstate(), "ints": list(range(20)), "mixed": [np.zeros(2)] + list(range(10))}
    seen: list[str] = []
    out = map_tree(state, lambda x: isinstance(x, np.ndarray), lambda p, x: seen.append(p) or x + 1)
    assert out["rng"] == state["rng"] and out["ints"] == state["ints"] and out["ints"] is not state["ints"]
    assert seen == ["mixed/0"] and out["mixed"][0][0] == 1.0
