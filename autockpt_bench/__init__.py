"""The framework study and the benchmarks, above the adapters: ``autockpt bench``, ``demo``,
``compare`` and ``goodput`` (:mod:`.cli`), their worker processes (:mod:`.workers`, started with
``python -m``; the only modules here that import a framework or an adapter) and the study's
framework-free parts (:mod:`.study`: workloads, the worker protocol, the kill loop, reports).
"""
