"""The framework study behind ``autockpt compare`` and ``autockpt goodput`` (framework-free parts).

``workloads``  the small/medium/large models both frameworks build, with their exact parameter counts;
``protocol``   how the commands talk to the per-framework worker processes (arguments, result keys);
the framework code itself lives in ``autockpt_bench.workers.{lightning,keras}_study``.
"""
