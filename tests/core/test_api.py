import autockpt_core


def test_all_is_exactly_the_public_api() -> None:
    public = {n for n in dir(autockpt_core) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(autockpt_core, n)).__name__ == "module"}
    assert set(autockpt_core.__all__) == public - modules
    assert {"young_interval", "daly_interval", "Config", "CheckpointSession"} <= set(autockpt_core.__all__)

