"""Storage faults while ``rlkit train`` writes: a full disk (ENOSPC), a disk quota (EDQUOT), a read-only file system
(EROFS), an output directory removed under the run.

Every write of a training run goes through :func:`writing`: each checkpoint (transformers, PEFT, torch and
safetensors write it; :func:`guard_checkpoints` wraps the trainer's save), the metrics log, the final adapter
(:func:`save_adapter`), the report, the resolved recipe and the trainer config. A fault there becomes a
:class:`~rlkit.errors.StorageError` naming the path, what was being written and why; ``rlkit train`` adds the last
complete checkpoint and the command that continues the run once space is freed (:func:`explain`), prints it as one
line and exits with code 74 (``EX_IOERR``), without a traceback.

Nothing written before the fault is damaged: the checkpoint being saved is removed (this save created it a moment
ago, it has no completion mark, and its space is what the user needs), a metrics line the disk refused is cut back
off (:func:`rlkit.jsonl.append_whole`), and the final adapter is written beside the old one and moved into place
only when whole. A fault that is not the disk's (a bug in a save) keeps its traceback.

torch's checkpoint writer loses the error number (``RuntimeError: [enforce fail at inline_container.cc:672] .
unexpected pos ...``): for such an error the file system says why (read-only, no space, the directory gone).
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit import compat, safety
from rlkit.errors import StorageError
from rlkit.launch import barrier


@contextmanager
def writing(what: str, path: Path, *, created: Path | None = None, then: str | None = None) -> Iterator[None]:
    """Turn a storage fault in the block (writing ``what`` to ``path``) into one :class:`StorageError`.

    ``created``: a directory the block made, removed on a fault (nothing else is). ``then``: what to do once
    space is freed, when it is not "continue from the last complete checkpoint".
    """
    try:
        yield
    except StorageError:
        _remove(created)
        raise
    except (OSError, RuntimeError, _safetensors_error()) as e:
        found = reason(e, path)
        if found is None:
            raise
        _remove(created)
        why, fix = found
        raise StorageError(f"{getattr(e, 'filename', None) or path}: cannot write {what}: {why}", fix, then) from e


def reason(error: BaseException, path: Path) -> tuple[str, str] | None:
    """Why the file system refused to write ``path`` and what makes it take writes again, or ``None`` when
    ``error`` is not the disk's doing."""
    number = error.errno if isinstance(error, OSError) else compat.safetensors_errno(error)
    if number in safety.STORAGE_FAULTS:
        return safety.STORAGE_FAULTS[number]
    if not path.parent.is_dir():  # removed under the run (ENOENT, or torch's "Parent directory ... does not exist")
        return f"its directory {path.parent} was removed", "leave the output directory in place"
    if number is not None or not compat.torch_write_failed(error):
        return None
    fs = os.statvfs(path.parent)
    number = errno.EROFS if fs.f_flag & os.ST_RDONLY else errno.ENOSPC if fs.f_bavail == 0 else None
    if number is not None:
        return safety.STORAGE_FAULTS[number]
    free = fs.f_bavail * fs.f_frsize / 2**20
    return f"the write was cut short with {free:.1f} MiB free there (a disk quota?)", "free space"


def explain(error: StorageError, command: list[str], checkpoints: list[Path], removed: bool) -> StorageError:
    """``error`` with what was kept and how to go on. ``command`` is ``rlkit train ... --resume``; ``removed``: the
    run directory held no checkpoint and was removed, so that a new start is not refused."""
    if error.then:
        return StorageError(f"{error}; {error.fix}, then {error.then}", error.fix)
    if checkpoints:
        return StorageError(f"{error}; the last complete checkpoint is {checkpoints[-1]}; {error.fix}, then "
                            f"continue with: {_join(command)}", error.fix)
    kept = " (the run directory held nothing else and was removed)" if removed else ""
    again = [arg for arg in command if arg != "--resume"]
    return StorageError(f"{error}; no complete checkpoint{kept}; {error.fix}, then start again: {_join(again)}",
                        error.fix)


def guard_checkpoints(trainer: Any) -> None:
    """Each checkpoint the trainer saves goes through :func:`writing` (the half-written one is removed)."""
    def wrap(save: Any) -> Any:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            path = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
            with writing("the checkpoint", path, created=None if path.exists() else path):
                return save(*args, **kwargs)
        return guarded

    compat.wrap_checkpoint_save(trainer, wrap)


def save_adapter(trainer: Any, tokenizer: Any, adapter: Path, main: bool = True) -> None:
    """Save the final adapter whole or not at all.

    Every rank calls ``save_model`` (ZeRO-3 and FSDP gather the weights there); transformers lets rank 0
    alone write, and rank 0 alone moves the result into place.
    """
    partial = adapter.with_name(f".{adapter.name}.partial")
    if main:
        shutil.rmtree(partial, ignore_errors=True)
    barrier()
    with writing("the final adapter", partial, created=partial if main else None):
        trainer.save_model(str(partial))
        barrier()
        if main:
            # Continuing from init_from with a KL reference, TRL keeps a frozen copy of the starting adapter
            # named "ref", and PEFT saves every adapter: the run's adapter is the trained one alone.
            shutil.rmtree(compat.peft_saved_adapter_dir(partial, "ref"), ignore_errors=True)
            tokenizer.save_pretrained(str(partial))
            shutil.rmtree(adapter, ignore_errors=True)
            os.replace(partial, adapter)
    barrier()


def _remove(created: Path | None) -> None:
    if created is not None and created.is_dir():
        shutil.rmtree(created, ignore_errors=True)


def _safetensors_error() -> type[Exception]:
    from safetensors import SafetensorError

    return SafetensorError


def _join(command: list[str]) -> str:
    import shlex

    return shlex.join(command)
