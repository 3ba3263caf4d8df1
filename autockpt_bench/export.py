"""``autockpt export DIR OUT``: one checkpoint of DIR as a file that loads without autockpt.

The checkpoint is the newest in DIR's manifest whose file verifies (size and CRC-32), as a resume
picks it: a corrupt newer one is skipped with the same warning (``--step N``: the newest of that
step; ``--seq N``: the one of that commit number, ``autockpt inspect``'s seq column). Its bytes
are read once, verified on the way (:class:`~autockpt_core.persist.whole_read.ReadWhileVerifying`),
and only those bytes are exported. OUT's ending picks the format:

``.ckpt``         Lightning: the checkpoint as Lightning wrote it, less autockpt's own callback
                  entry (:mod:`autockpt_lightning.export`); ``LightningModule.load_from_checkpoint``
                  and ``Trainer.fit(ckpt_path=...)`` take it.
``.safetensors``  the model's tensors only: Lightning's ``state_dict``; Keras' ``model`` group
                  keyed by variable path (no model needed).
``.weights.h5``   Keras ``model.save_weights``; ``.keras``: ``model.save`` (architecture, weights
                  and, for a compiled model, the optimizer's state). The checkpoint holds no
                  architecture: ``--model MODULE:FUNCTION`` (or ``path/to/script.py:FUNCTION``)
                  names a function that returns the built model.

OUT is written to a temporary file beside it and renamed into place (an existing OUT only with
``--force``). Bad input is a ``ValueError``: one line, exit 2 (``autockpt_core.cli.commands.main``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import os
import pickle
import sys
import uuid
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator

from autockpt_core.cli.inspect import checkpoint_storage, storage_options_arg  # as inspect's
from autockpt_core.persist import (
    MANIFEST_NAME,
    CheckpointRecord,
    Storage,
    find_latest_valid,
    location_of,
    read_manifest,
)
from autockpt_core.persist.storage import fsync_directory
from autockpt_core.persist.tensorfile import write_tensor_file
from autockpt_core.persist.whole_read import ReadWhileVerifying
from autockpt_core.units import format_size

HELP = ("write a checkpoint of a directory as a plain file: Lightning .ckpt, Keras .weights.h5 or .keras, "
        "or .safetensors")

FORMATS: dict[str, tuple[str, ...]] = {
    ".ckpt": ("lightning",),
    ".weights.h5": ("keras",),
    ".keras": ("keras",),
    ".safetensors": ("lightning", "keras"),
}
"""OUT's ending -> the frameworks whose checkpoints it can hold (checked in this order)."""
NAMES = {"lightning": "Lightning", "keras": "Keras"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirpath", metavar="DIR", help="checkpoint directory (or URL) AutoCheckpoint wrote to")
    parser.add_argument(
        "out",
        metavar="OUT",
        help="the file to write; its ending picks the format: .ckpt (Lightning), .weights.h5 or .keras "
        "(Keras, with --model), .safetensors (either: the model's tensors)",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--step", type=int, default=None,
                       help="the newest valid checkpoint of this step (default: the newest valid one)")
    which.add_argument("--seq", type=int, default=None,
                       help="the checkpoint of this commit number (the seq column of autockpt inspect)")
    parser.add_argument("--framework", choices=sorted(NAMES), default=None,
                        help="whose checkpoints, where DIR holds both")
    parser.add_argument(
        "--model",
        default=None,
        metavar="MODULE:FUNCTION",
        help="Keras .weights.h5 and .keras: a function that returns the built model (e.g. mypkg.models:build_model "
        "or train.py:build_model); its module is imported, so training in it must sit under "
        "if __name__ == '__main__'",
    )
    parser.add_argument(
        "--allow-pickle",
        action="store_true",
        help="Lightning: load the checkpoint with full unpickling (runs code named in the file) where it holds "
        "objects a weights-only load refuses",
    )
    parser.add_argument(
        "--storage-options",
        type=storage_options_arg,
        default=None,
        metavar="JSON",
        help="fsspec options for a URL DIR, as a JSON object (or a YAML/TOML config file with storage_options), "
        "as for autockpt inspect",
    )
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists")


def run(args: argparse.Namespace) -> int:
    ending = _ending(args.out)
    _check_out(args.out, args.force)
    storage = checkpoint_storage(args.dirpath, args.storage_options)
    records = read_manifest(storage)
    framework = _framework(records, ending, args.framework, storage.location)
    _check_flags(framework, ending, args)
    _check_not_listed(args.out, storage, records)
    record, data = _pick(storage, records, framework, args.step, args.seq)
    source = location_of(storage, record.name)
    export = _lightning if framework == "lightning" else _keras
    with _replacing(args.out, args.force) as tmp:
        what, note = export(data, record, source, ending, tmp, args)
    seq = f" (seq {record.seq})" if args.seq is not None else ""
    size = format_size(os.path.getsize(args.out))
    print(f"wrote {args.out} ({size}): {what} of step {record.step}{seq} from {source}{note}")
    return 0


def _ending(out: str) -> str:
    for ending in FORMATS:
        if out.endswith(ending) and len(os.path.basename(out)) > len(ending):
            return ending
    hint = " (Keras' weights files end in .weights.h5)" if out.endswith(".h5") else ""
    raise ValueError(f"cannot tell the format of {out!r} from its ending{hint}; use one of {', '.join(FORMATS)}")


def _check_out(out: str, force: bool) -> None:
    if "://" in out:
        raise ValueError(f"OUT must be a local path, got {out!r}")
    if os.path.isdir(out):
        raise ValueError(f"{out} is a directory; OUT is the file to write")
    if os.path.exists(out) and not force:
        raise ValueError(f"{out} exists; pass --force to replace it")
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ValueError(f"the directory of {out} ({parent}) does not exist")


def _framework(records: list[CheckpointRecord], ending: str, chosen: str | None, location: str) -> str:
    """The framework whose checkpoint to export: the one ``ending`` fits among those in the manifest."""
    present = list(dict.fromkeys(r.framework for r in records))
    if not present:
        raise ValueError(f"the manifest in {location} lists no checkpoints")
    held = " and ".join(NAMES.get(f, f) for f in present)
    if chosen is not None and chosen not in present:
        raise ValueError(f"{location} holds no {NAMES[chosen]} checkpoints (it holds {held} checkpoints)")
    fitting = [f for f in present if f in FORMATS[ending] and chosen in (None, f)]
    if not fitting:
        formats = " or ".join(e for e, fs in FORMATS.items() if any(f in fs for f in present)) or "another ending"
        owners = " or ".join(NAMES[f] for f in FORMATS[ending])
        raise ValueError(f"{location} holds {held} checkpoints; a {ending} file is for {owners}. Fix: name OUT with {formats}")
    if len(fitting) > 1:
        raise ValueError(f"{location} holds {held} checkpoints; pass --framework to say whose to export")
    return fitting[0]


def _check_flags(framework: str, ending: str, args: argparse.Namespace) -> None:
    if framework == "keras" and ending in (".weights.h5", ".keras") and not args.model:
        raise ValueError(
            f"a Keras checkpoint holds weights but no architecture: pass --model MODULE:FUNCTION (a function that "
            f"returns the built model) to write {ending}, or write OUT as .safetensors (weights only, no model needed)"
        )
    if args.model and not (framework == "keras" and ending in (".weights.h5", ".keras")):
        raise ValueError(f"--model applies to Keras .weights.h5 and .keras files, not to a {NAMES[framework]} {ending}")
    if args.allow_pickle and framework != "lightning":
        raise ValueError("--allow-pickle applies to Lightning checkpoints (Keras checkpoints hold no pickles)")


def _check_not_listed(out: str, storage: Storage, records: list[CheckpointRecord]) -> None:
    """OUT is never a checkpoint file (or the manifest) of DIR, even with --force."""
    names = [MANIFEST_NAME, *(r.name for r in records)]
    paths = {os.path.realpath(p) for p in map(storage.local_path, names) if p is not None}
    if os.path.realpath(out) in paths:
        raise ValueError(f"{out} is one of the files autockpt keeps in {storage.location}; write OUT elsewhere")


def _pick(
    storage: Storage, records: list[CheckpointRecord], framework: str, step: int | None, seq: int | None
) -> tuple[CheckpointRecord, Any]:
    """The newest record of ``framework`` (of ``step``, or of ``seq``) whose file verifies, and its
    verified bytes. Skipped records are warned about on stderr, as a resume warns."""
    def accept(record: CheckpointRecord) -> bool:
        return (step is None or record.step == step) and (seq is None or record.seq == seq)

    reads = ReadWhileVerifying(storage)
    with warnings.catch_warnings(record=True) as skipped:
        warnings.simplefilter("always")
        record = find_latest_valid(storage, framework=framework, accept=accept, check=reads.check)
    for warning in skipped:
        print(warning.message, file=sys.stderr)
    name = NAMES[framework]
    which = f" of step {step}" if step is not None else f" with seq {seq}" if seq is not None else ""
    if record is None:
        listed = [r for r in records if r.framework == framework]
        if not any(accept(r) for r in listed):
            known = (f"its steps: {', '.join(str(r.step) for r in listed)}" if step is not None
                     else f"its seqs: {', '.join(str(r.seq) for r in listed)}")
            raise ValueError(f"no {name} checkpoint{which} in {storage.location} ({known})")
        raise ValueError(f"no {name} checkpoint{which} in {storage.location} verifies (each one is named above)")
    data = reads.take(record)
    if data is None:  # a multi-file record: a sharded model's directory
        raise ValueError(
            f"the checkpoint of step {record.step} ({record.name}) is a sharded model's directory, which this "
            "command does not convert; Lightning loads it as it is: "
            f"trainer.fit(ckpt_path={location_of(storage, record.name)!r})"
        )
    return record, data


@contextlib.contextmanager
def _replacing(out: str, force: bool) -> Iterator[str]:
    """A temporary path beside ``out`` with its ending (Keras checks it), renamed over ``out``
    once the block wrote it (fsync'ed), removed when the block fails."""
    directory, name = os.path.split(os.path.abspath(out))
    tmp = os.path.join(directory, f".autockpt-export-{uuid.uuid4().hex[:12]}-{name}")
    try:
        yield tmp
        if not os.path.isfile(tmp):
            raise RuntimeError(f"the export wrote nothing to {tmp}")
        os.chmod(tmp, 0o666 & ~_umask())  # as a plain open() would create it (safetensors makes it 0600)
        with open(tmp, "rb+") as written:
            os.fsync(written.fileno())
        if os.path.exists(out) and not force:  # written meanwhile
            raise ValueError(f"{out} exists; pass --force to replace it")
        os.replace(tmp, out)
        fsync_directory(Path(directory))
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _metadata(framework: str, record: CheckpointRecord, **more: Any) -> dict[str, str]:
    """The safetensors header's metadata of an exported file (strings only)."""
    meta = {"framework": framework, "step": str(record.step), "epoch": str(record.epoch), "source": record.name}
    meta.update({k: str(v) for k, v in more.items() if v is not None})
    return meta


def _lightning(
    data: Any, record: CheckpointRecord, source: str, ending: str, tmp: str, args: argparse.Namespace
) -> tuple[str, str]:
    """Write the Lightning checkpoint in ``data`` to ``tmp``; returns what was written and a note."""
    from autockpt_lightning import export as lx

    try:
        checkpoint = lx.read_checkpoint(data, allow_pickle=args.allow_pickle)
    except (pickle.UnpicklingError, RuntimeError) as exc:
        names = lx.refused_names(data) if isinstance(exc, pickle.UnpicklingError) else []
        if not names:  # verified, and still no torch file: not written by torch.save
            first = str(exc).strip().split(". ")[0].rstrip(".")
            raise ValueError(f"{source} does not load as a torch checkpoint ({type(exc).__name__}: {first})") from None
        raise ValueError(
            f"{source} holds {', '.join(names)}, which a weights-only load refuses. Fix: --allow-pickle if you trust "
            f"everyone who can write {args.dirpath} (unpickling runs code named in the file)"
        ) from None
    if ending == ".ckpt":
        plain, left_out = lx.plain_checkpoint(checkpoint)
        lx.save_checkpoint(plain, tmp)
        return "Lightning checkpoint", ", without autockpt's callback state" if left_out else ""
    tensors, skipped = lx.model_tensors(checkpoint)
    if skipped:
        print(f"autockpt export: left out the state_dict entries that are no tensors: {', '.join(skipped)}",
              file=sys.stderr)
    lx.save_tensors(tensors, tmp, _metadata("lightning", record, format="pt"))
    return f"the LightningModule's state_dict ({len(tensors)} tensors)", ""


def _keras(
    data: Any, record: CheckpointRecord, source: str, ending: str, tmp: str, args: argparse.Namespace
) -> tuple[str, str]:
    """Write the Keras checkpoint in ``data`` to ``tmp``; returns what was written and a note."""
    from autockpt_keras import export as kx
    from autockpt_keras.checkpoint_file import read_checkpoint_bytes

    arrays, info = read_checkpoint_bytes(data, source, copy=False)
    if ending == ".safetensors":
        weights = kx.model_arrays(arrays, info)
        meta = _metadata("keras", record, backend=info.backend, keras_version=info.keras_version)
        with open(tmp, "xb") as out:
            write_tensor_file(out, weights, meta)
        return f"the Keras model's variables ({len(weights)} arrays)", ""
    build, label = _model_function(args.model)
    model = build()
    if not hasattr(model, "save_weights"):
        raise ValueError(f"--model {args.model}: {label} returned a {type(model).__name__}, not a Keras model")
    # The optimizer too: Keras writes a compiled model's optimizer into both files (built here if not yet).
    kx.load_into(model, arrays, info, include_optimizer=True)
    if ending == ".weights.h5":
        model.save_weights(tmp)
    else:
        model.save(tmp)
    optimizer = "with its optimizer state" if getattr(model, "optimizer", None) is not None else "not compiled: no optimizer"
    return "Keras weights" if ending == ".weights.h5" else "Keras model", f", in the model {label} built, {optimizer}"


def _model_function(spec: str) -> tuple[Callable[[], Any], str]:
    """The function ``--model`` names, and how to call it in messages (``build_model()``)."""
    target, _, name = spec.rpartition(":")
    if not target or not name.isidentifier():
        raise ValueError(f"--model {spec}: expected MODULE:FUNCTION or path/to/script.py:FUNCTION")
    if target.endswith(".py") or os.sep in target:
        if not os.path.isfile(target):
            raise ValueError(f"--model {spec}: no such file {target}")
        _importable(os.path.dirname(os.path.abspath(target)))  # the script's own imports of its neighbours
        spec_ = importlib.util.spec_from_file_location(f"autockpt_export_model_{uuid.uuid4().hex[:8]}", target)
        assert spec_ is not None and spec_.loader is not None
        module = importlib.util.module_from_spec(spec_)
        spec_.loader.exec_module(module)
    else:
        _importable(os.getcwd())  # an entry point's sys.path lacks the working directory
        try:
            module = importlib.import_module(target)
        except ModuleNotFoundError as exc:
            raise ValueError(f"--model {spec}: {exc}") from None
    build = getattr(module, name, None)
    if not callable(build):
        raise ValueError(f"--model {spec}: {target} has no function {name}")
    return build, f"{name}()"


def _importable(directory: str) -> None:
    if directory not in sys.path:
        sys.path.insert(0, directory)
