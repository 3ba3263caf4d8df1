"""The part of ``autockpt_core`` the adapters (``autockpt_lightning``, ``autockpt_keras``) and
their shared torch code (``autockpt_torch``) build on: every module they may import.

``tests/core/test_layout.py`` checks every adapter module's imports against this list, so a
new dependency of an adapter on the core's insides is a deliberate change here.
"""

ADAPTER_SURFACE = frozenset(
    {
        "autockpt_core",  # the public API: Config, CheckpointSession, Snapshot, errors, ...
        "autockpt_core.config",
        "autockpt_core.callback_settings",  # the keywords both callbacks take
        "autockpt_core.checkpoint_event",
        "autockpt_core.fit_driver",  # the checkpoint protocol of one fit(), driven from the hooks
        "autockpt_core.internals_door",  # a framework's private names: table, lookups, report, undo stack
        "autockpt_core.preemption_sources",  # the fit's preemption handler: signals, a deadline
        "autockpt_core.rng",  # Python's and numpy's generators, which adapters extend
        "autockpt_core.units",  # human sizes and durations (the demos print them)
        "autockpt_core.agreed_check",  # files every process wrote, verified by all
        "autockpt_core.persist",
        "autockpt_core.persist.buffers",
        "autockpt_core.persist.checksum",
        "autockpt_core.persist.failures",
        "autockpt_core.persist.fetched_copies",  # where a resume's local copies go, and their cleanup
        "autockpt_core.persist.file_set",
        "autockpt_core.persist.persist_process",
        "autockpt_core.persist.shared_memory",
        "autockpt_core.persist.storage",
        "autockpt_core.persist.tensorfile",
        "autockpt_core.persist.tree",
        "autockpt_core.persist.verified_fetch",  # a resume's single download of a URL's checkpoint
        "autockpt_core.persist.whole_read",  # a resume's single pass over the file it loads
        "autockpt_core.policy.agreement",
        "autockpt_core.policy.checkpoint_cost",
        "autockpt_core.policy.mode_trial",
        "autockpt_core.policy.process_group",
        "autockpt_core.policy.rank_timing",
    }
)
