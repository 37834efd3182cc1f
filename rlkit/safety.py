"""What rlkit may delete, who may write, and how records reach the disk.

Ownership: every directory rlkit creates for its outputs (run directories, merged models, default rollout
and eval folders) gets a marker file first. rlkit deletes or replaces only a directory that holds the
marker, is empty, or (for run directories made before markers existed) holds nothing but the files a run
writes. Some places are refused whatever they hold: ``/``, the working directory and its parents,
``$HOME`` and its parents, a git repository's root, a symbolic link, and any input of the command (the
``init_from`` run, the adapter being merged).

One writer: :func:`hold` takes an OS lock (``filelock``: ``flock`` on POSIX, released by the kernel when the
holder dies, so a stale lock is simply taken over) on a file in rlkit's cache named after the output's
path, and records the holder's pid in it for the error a second process gets.

Records: :class:`JsonlAppender` writes one JSON line per finished record and flushes it, so the file is
valid JSONL at every instant and a kill loses only records in flight; ``resume`` reads back what a
killed run wrote (dropping a half-written last line) so the caller can skip it.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit.errors import StorageError, UserError
from rlkit.jsonl import append_whole, read_records

log = logging.getLogger("rlkit")

MARKER = ".rlkit-owned"
LOCK_SUFFIX = ".rlkit-lock"
# A run directory written before markers existed is recognised by these names alone.
RUN_FILES = frozenset({"recipe.resolved.yaml", "metrics.jsonl", "checkpoints", "adapter", "wandb", "tensorboard",
                       "plots", "report.md", "eval", "rollouts", ".adapter.partial", MARKER})
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


# ---------------------------------------------------------------------------------------------
# Ownership


def check_target(path: str | Path, flag: str, inputs: Iterable[str | Path] = ()) -> Path:
    """Refuse, with one line naming ``path``, an output location rlkit must never delete or replace."""
    path = Path(path).expanduser()
    if path.is_symlink():
        raise UserError(f"{flag} {path}: is a symbolic link; give the real path")
    target = path.resolve()
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if target == Path(target.anchor):
        raise UserError(f"{flag} {path}: is the file system root; choose a new directory")
    if target == cwd or target in cwd.parents:
        raise UserError(f"{flag} {path}: is the current directory or one of its parents; choose a new directory")
    if target == home or target in home.parents:
        raise UserError(f"{flag} {path}: is your home directory or one of its parents; choose a new directory")
    if target.is_dir() and (target / ".git").exists():
        raise UserError(f"{flag} {path}: is the root of a git repository; choose a new directory")
    for source in inputs:
        src = Path(source).expanduser()
        if not src.exists():
            continue
        src = src.resolve()
        if target == src or target in src.parents or src in target.parents:
            raise UserError(f"{flag} {path}: overlaps the input directory {src}; write elsewhere")
    return path


def owned(path: Path, legacy: frozenset[str] = frozenset()) -> bool:
    """Whether rlkit may delete the directory ``path``: marked, empty, or holding only ``legacy`` names."""
    if (path / MARKER).is_file():
        return True
    names = {p.name for p in path.iterdir()}
    return not names or bool(legacy and "recipe.resolved.yaml" in names and names <= legacy)


def remove(path: str | Path, flag: str, inputs: Iterable[str | Path] = (), legacy: frozenset[str] = frozenset(),
           *, delete: bool = True) -> None:
    """Delete the directory ``path`` if rlkit owns it; otherwise refuse with one line (``delete=False``: only check)."""
    path = check_target(path, flag, inputs)
    if not path.exists():
        return
    if not path.is_dir():
        raise UserError(f"{flag} {path}: exists and is not a directory")
    if not owned(path, legacy):
        foreign = sorted(p.name for p in path.iterdir() if p.name not in legacy)[:3]
        raise UserError(f"{flag} {path}: holds files rlkit did not write ({', '.join(foreign)}); rlkit deletes only "
                        "what it created: delete it yourself or choose a new directory")
    if delete:
        shutil.rmtree(path)


def make_dir(path: str | Path, kind: str) -> Path:
    """Create ``path`` (and missing parents) with the ownership marker written first."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        marker = path / MARKER
        if not marker.exists():
            marker.write_text(json.dumps({"kind": kind, "pid": os.getpid()}) + "\n")
    except OSError as e:
        raise os_error(e, path) from None
    return path


def make_parent(path: Path, kind: str) -> None:
    """The folders above an output file, each one rlkit creates marked as its own."""
    missing = [p for p in reversed(path.parents) if not p.exists()]
    for folder in missing:
        make_dir(folder, kind)


def check_replaceable_file(path: str | Path, flag: str, keys: Iterable[str]) -> Path:
    """Refuse to replace ``path`` unless it is empty or a JSON/JSONL file whose first record has ``keys``."""
    path = check_target(path, flag)
    if not path.exists():
        return path
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory; give a file path")
    with path.open("rb") as f:
        head = f.readline(1 << 26)  # a JSONL file's first record, whole (a trajectory can be long)
        head += f.read(1 << 16)
    if not head.strip():
        return path
    if head.startswith(b"{\n"):  # an indented JSON document (eval results): its top-level keys, read by line
        found = set(re.findall(rb'^  "(\w+)": ', head, flags=re.MULTILINE))
        record = {k.decode(): None for k in found}
    else:
        try:
            record = json.loads(head.split(b"\n", 1)[0].decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            record = None
    if not (isinstance(record, dict) and set(keys) <= set(record)):
        raise UserError(f"{flag} {path}: is not a file rlkit wrote; rlkit replaces only its own outputs: "
                        "delete it yourself or choose a new file")
    return path


# The disk's state, not the command's (a StorageError, exit code 74, wherever it happens): why, and what makes it
# take writes again.
STORAGE_FAULTS = {errno.ENOSPC: ("no space left on the device", "free space"),
                  errno.EDQUOT: ("disk quota exceeded", "free space"),
                  errno.EROFS: ("read-only file system", "make the file system writable"),
                  errno.EFBIG: ("file too large for the file system or ulimit -f", "write elsewhere, or raise it")}


def os_error(error: OSError, path: Path) -> UserError:
    """A one-line error for what the file system refused (read-only, full, a file in the way)."""
    if error.errno in STORAGE_FAULTS:
        reason, fix = STORAGE_FAULTS[error.errno]
        return StorageError(f"{error.filename or path}: cannot write: {reason}", fix)
    reasons = {errno.EACCES: "permission denied", errno.EPERM: "permission denied",
               errno.ENOTDIR: "a file is in the way of a directory", errno.EEXIST: "exists and is not a directory"}
    return UserError(f"{error.filename or path}: cannot write: {reasons.get(error.errno, error.strerror or error)}")



# ---------------------------------------------------------------------------------------------
# One writer


def lock_path(path: str | Path) -> Path:
    """The lock of an output lives in rlkit's cache, keyed by the output's absolute path: nothing is left
    next to the user's files, and a lock file is never deleted (unlinking a flock file lets two holders in)."""
    import hashlib

    from rlkit.cache import cache_dir

    key = str(Path(path).expanduser().resolve())
    return cache_dir() / "locks" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}{LOCK_SUFFIX}"


@contextmanager
def hold(path: str | Path) -> Iterator[None]:
    """Hold the one-writer lock of the output ``path`` for the ``with`` block."""
    from filelock import FileLock, Timeout

    path = Path(path)
    lockfile = lock_path(path)
    try:
        lockfile.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lockfile), timeout=0)
        lock.acquire()
    except Timeout:
        raise UserError(f"{path}: in use by another rlkit process (pid {_holder(lockfile)}); wait for it to finish "
                        f"or stop it") from None
    except OSError as e:
        raise os_error(e, lockfile) from None
    try:
        # flock never truncates; the holder writes its pid so a second process can say who holds it.
        with open(lockfile, "r+") as f:
            f.truncate(0)
            f.write(f"{os.getpid()}\n")
        yield
    finally:
        lock.release()


def _holder(lockfile: Path) -> str:
    try:
        return lockfile.read_text().strip() or "unknown"
    except OSError:
        return "unknown"


# ---------------------------------------------------------------------------------------------
# Records


def dumps(record: Any, indent: int | None = None) -> str:
    """JSON text for any record, secrets masked; text from a model or server is kept whole.

    A lone surrogate (``\\ud800``, which some servers send) cannot be encoded as UTF-8; it is written as
    its JSON escape, which reads back as the same string.
    """
    from rlkit.secrets import redact

    text = json.dumps(record, ensure_ascii=False, indent=indent)
    return redact(_LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text))


def write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` atomically (a reader sees the old file or the new, never half)."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise os_error(e, path) from None


class JsonlAppender:
    """Append one flushed JSON line per record. ``resume`` keeps what the file already holds."""

    def __init__(self, path: str | Path, *, resume: bool = False, keys: Iterable[str] = ()) -> None:
        self.path = Path(path)
        self.done: list[dict[str, Any]] = []
        if resume and self.path.exists():
            # Only a file rlkit wrote is continued (and its torn last line cut): never a user's file.
            check_replaceable_file(self.path, "--out", keys)
            self.done = read_records(self.path, torn_tail="cut")
        elif not resume and self.path.exists():
            raise UserError(f"{self.path}: already exists; pass --resume to continue it or choose a new file")
        make_parent(self.path, "output")
        self._created, self.written = not self.path.exists(), 0
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as e:
            raise os_error(e, self.path) from None

    def write(self, record: dict[str, Any]) -> None:
        """Append one line with unbuffered writes: nothing waits in a buffer for a kill to lose, and a
        write the disk refuses (full) is cut back off, so the file holds whole lines only."""
        try:
            append_whole(self._fd, (dumps(record) + "\n").encode("utf-8"))
        except OSError as e:
            raise os_error(e, self.path) from None
        self.written += 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        self.close()
        if kind is not None and self._created and not self.written:
            self.path.unlink(missing_ok=True)  # a run that failed before its first record leaves no empty file


# ---------------------------------------------------------------------------------------------
# Bounded inputs

MAX_RECIPE_BYTES = 1 << 20  # the largest shipped recipe is ~3 KB
MAX_DEPTH = 50
MAX_VALUES = 100_000  # scalars + collections after aliases are expanded


def load_yaml(path: Path) -> Any:
    """A YAML file read with bounds: size, UTF-8, nesting depth, and the size aliases expand to.

    The alias check walks the composed node graph (shared nodes counted once per use, memoised), so a
    "billion laughs" file is refused in microseconds, before anything is expanded.
    """
    import yaml

    try:
        size = path.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise UserError(f"{path}: {size} bytes; a recipe is at most {MAX_RECIPE_BYTES} bytes")
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not UTF-8 text (byte {e.start}: {raw[e.start:e.start + 1]!r}); "
                        "save the recipe as UTF-8") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise UserError(f"{path}: nested too deeply (at most {MAX_DEPTH} levels)") from None
    if node is not None:
        _expanded_size(node, path, 0, {}, set())
    return yaml.safe_load(text)


def _expanded_size(node: Any, path: Path, depth: int, memo: dict[int, int], active: set[int]) -> int:
    import yaml

    if depth > MAX_DEPTH:
        raise UserError(f"{path}: nested too deeply (at most {MAX_DEPTH} levels)")
    key = id(node)
    if key in memo:
        return memo[key]
    if isinstance(node, yaml.ScalarNode):
        return 1
    if key in active:
        raise UserError(f"{path}: line {node.start_mark.line + 1}: an alias refers to itself")
    active.add(key)
    children = node.value if isinstance(node, yaml.SequenceNode) else [n for pair in node.value for n in pair]
    total = 1
    for child in children:
        total += _expanded_size(child, path, depth + 1, memo, active)
        if total > MAX_VALUES:
            raise UserError(f"{path}: YAML aliases expand to more than {MAX_VALUES} values; refusing to expand "
                            "them (an alias bomb?)")
    active.discard(key)
    memo[key] = total
    return total
