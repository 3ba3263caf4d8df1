"""Worker processes of the commands: one benchmark configuration or demo per interpreter.

Started as ``python -m autockpt_bench.workers.<name>`` by ``autockpt bench`` and
``autockpt demo``, so each framework runs in its own process and each peak-memory figure
belongs to one configuration. The ``lightning_*`` and ``keras_*`` workers are the only modules
under ``autockpt_core`` that import a framework (and the adapters); nothing imports them
in-process. :mod:`.measure` (numpy only) holds what they share.
"""
