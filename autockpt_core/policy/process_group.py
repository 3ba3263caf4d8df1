"""The processes of one job, as the adapters see them: who writes, and how they stay in agreement.

Only process 0 (Lightning's global rank 0, JAX's process 0) runs the checkpoint session; every
process must still do the same thing at each step boundary, and a failure on any one of them
must stop them all, not leave the others waiting in a collective until a timeout. A
:class:`ProcessGroup` holds those rules once; an adapter subclass supplies the two collectives
its framework has (:meth:`~ProcessGroup.max_over_processes`, :meth:`~ProcessGroup.text_from`):
Lightning an all-reduce and a broadcast over ``torch.distributed``, the Keras JAX adapter
``process_allgather``. The base class is a one-process job: both are local and free.

Call order and threading: the training thread; every process calls each method at the same
point, in the same order (each is a collective when ``count > 1``).
"""

from __future__ import annotations

from typing import Sequence

from ..errors import AutockptError
from .agreement import Agreement, decode, encode
from .rank_timing import RankTimes

__all__ = ["AGREED", "PeerFailedError", "ProcessGroup"]

AGREED = "_autockpt_agreed"
"""Attribute set on an error every process raises after one agreement (not agreed again)."""


class PeerFailedError(AutockptError):
    """Raised on every process of a job when another one failed (its message inside)."""


class ProcessGroup:
    """This process's ``index``, the process ``count``, and the agreement over them.

    ``member``: what a process is called in messages ("rank", "process"); ``peer_error``: the
    class raised on the processes that did not fail themselves.
    """

    index: int = 0
    count: int = 1
    member = "process"
    peer_error: type[AutockptError] = PeerFailedError

    @property
    def writes(self) -> bool:
        """Whether this process runs the session and writes the checkpoints (process 0)."""
        return self.index == 0

    # -- the two collectives a subclass supplies ------------------------------------------------

    def max_over_processes(self, numbers: Sequence[float]) -> list[float]:
        """The element-wise maximum of every process's ``numbers`` (float64, exact)."""
        return list(numbers)

    def text_from(self, source: int, text: str) -> str:
        """Process ``source``'s ``text``, on every process."""
        return text

    # -- the rules ------------------------------------------------------------------------------

    def agree(
        self,
        *,
        save: bool = False,
        unclean: bool = False,
        signum: int | None = None,
        failed: bool = False,
        times: RankTimes = RankTimes(0.0, 0.0),
    ) -> Agreement:
        """Process 0's ``save`` and ``unclean``, any process's signal and failure, the slowest
        process's times (:mod:`~autockpt_core.policy.agreement`)."""
        return decode(
            self.max_over_processes(
                encode(self.index, save=save, unclean=unclean, signum=signum, failed=failed, times=times)
            )
        )

    def settle(
        self,
        error: BaseException | None,
        *,
        save: bool = False,
        unclean: bool = False,
        signum: int | None = None,
        times: RankTimes = RankTimes(0.0, 0.0),
    ) -> Agreement:
        """:meth:`agree` with this process's ``error`` as its failure, then that failure raised on
        every process (:meth:`raise_agreed_failure`). One process: ``error`` is raised, else its
        own report comes back, without encoding it (a hot path: every step of every job)."""
        if self.count <= 1:
            if error is not None:
                raise error
            return Agreement(save=save, unclean=unclean, signum=signum, failed_rank=None, slowest=times)
        agreed = self.agree(save=save, unclean=unclean, signum=signum, failed=error is not None, times=times)
        self.raise_agreed_failure(agreed.failed_rank, error)
        return agreed

    def raise_if_any_failed(self, error: BaseException | None) -> None:
        """When any process has an ``error``, every process raises (one process: ``error`` itself).

        The failing process raises its own exception; the others a :attr:`peer_error` with its
        message. An error that every process already raised from one agreement (a later hook
        meets it again) is passed on without a second round.
        """
        if self.count <= 1:
            if error is not None:
                raise error
            return
        if error is not None and getattr(error, AGREED, False):
            raise error
        self.raise_agreed_failure(self.agree(failed=error is not None).failed_rank, error)

    def raise_agreed_failure(self, failed: int | None, error: BaseException | None) -> None:
        """After an agreement that reported process ``failed`` (None: none did): its message
        goes to every process, and every process raises (its own error where it has one)."""
        if failed is None:
            return
        message = self.text_from(failed, f"{type(error).__name__}: {error}" if error is not None else "")
        if error is None:  # a process that failed itself raises its own error, whichever is reported
            m = self.member
            error = self.peer_error(f"autockpt: {m} {failed} stopped training, so every {m} stops: {message}")
        setattr(error, AGREED, True)
        raise error
