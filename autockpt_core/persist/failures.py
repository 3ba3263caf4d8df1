"""What a failed persist left behind, said truly: one message per stage, with the fix.

The writer thread builds a :class:`PersistFailure` where a stage fails; the training thread
raises its :meth:`~PersistFailure.message` as ``CheckpointWriteError``. Older checkpoints are
untouched in every stage: nothing is deleted before the new checkpoint is committed.
"""

from __future__ import annotations

import dataclasses
import errno

from ..errors import MirrorWriteError
from .storage_errors import diagnose

STAGES = ("write", "commit", "durable", "callback")
"""write: the checkpoint file; commit: the manifest listing it; durable: the manifest is
replaced but its directory fsync failed; callback: the after-commit callback."""


@dataclasses.dataclass(frozen=True)
class PersistFailure:
    """One failed persist: the stage, the error, and a file that could not be removed, if any."""

    stage: str
    error: BaseException
    name: str
    step: int
    location: str
    leftover: str | None = None
    removal_error: BaseException | None = None

    def message(self) -> str:
        cause = f"{type(self.error).__name__}: {self.error}"
        what = f"checkpoint {self.name} (step {self.step})"
        fix = f"Fix: {fix_for(self.error)}."
        untouched = "Older checkpoints are untouched."
        if self.stage == "callback":
            return f"autockpt committed {what} to {self.location}, but the after-commit callback failed: {cause}."
        if self.stage == "durable":
            return (
                f"autockpt listed {what} in the manifest in {self.location}, but could not make the manifest "
                f"durable: {cause}. The checkpoint is usable now; after a power loss the directory may show "
                f"the previous manifest. {untouched} {fix}"
            )
        if self.stage == "commit":
            head = f"autockpt wrote {what} to {self.location} but could not list it in the manifest: {cause}."
            removed = "The unlisted file was removed (it would never be used)."
        else:
            head = f"autockpt could not persist {what} to {self.location}: {cause}."
            removed = "Nothing of it is left on disk."
        if self.leftover is not None:
            removed = (
                f"Removing the unlisted file failed too ({type(self.removal_error).__name__}: "
                f"{self.removal_error}): it is never used; delete {self.leftover} by hand."
            )
        return f"{head} {removed} {untouched} {fix}"


def fix_for(error: BaseException, field: str = "dirpath") -> str:
    """What to do about a storage error: an object store's cause (credentials, endpoint, bucket,
    permission: :func:`~.storage_errors.diagnose`), else from its errno where it has one;
    ``field`` names the setting that points there (``dirpath``, or ``mirror``)."""
    found = diagnose(error, field=field)
    if found is not None:
        return found.fix
    code = getattr(error, "errno", None)
    if code in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return f"the disk or quota is full; free space there or point {field} to a larger filesystem"
    if code in (errno.EACCES, errno.EPERM):
        return f"this process may not write there; fix the directory's permissions or choose another {field}"
    if code == errno.EROFS:
        return f"the filesystem is read-only; point {field} to a writable one"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return f"{field} is a file, or lies under one; point {field} to a directory (it is created if missing)"
    return "check free space, permissions and the storage backend"


def unfinished_message(error: BaseException, dirpath: str) -> str:
    """What the log says when the session of a run that failed could not finish cleanly (an
    adapter's failure path, where its own exception is the one raised): a mirror's error leaves
    the checkpoints committed in ``dirpath``; any other left the one in flight unpersisted."""
    if isinstance(error, MirrorWriteError):
        return (
            f"autockpt: the checkpoints of the failed run are committed in {dirpath}, but the mirror "
            f"does not have the newest: {error}"
        )
    return f"autockpt: the checkpoint in flight when training failed was not persisted: {error}"
