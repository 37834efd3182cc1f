"""The exception type for mistakes a user can fix (bad recipe, flag or file), and ``BadValue``, its kind for an
argument outside its choices; ``StorageError`` for a disk that refused a write.

The CLI turns a ``UserError`` into one line on stderr and exit code 2 (a ``StorageError``: exit code 74);
anything else is a bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, with the message they need to fix it."""


class BadValue(UserError, ValueError):
    """An argument outside what it accepts, named with its choices (a generator's ``wording``, ``size``, ``ops``):
    a ``ValueError`` to a Python caller, one line to the CLI. A plain ``ValueError`` stays a bug."""


class StorageError(UserError):
    """The file system refused a write: full (ENOSPC), over a quota (EDQUOT), read-only (EROFS), or the directory
    was removed. The machine's state rather than the command's, so a distinct exit code: 74 (``EX_IOERR`` in
    sysexits.h). ``fix`` says how to make the disk take writes again ("free space"); ``then``, when set, what to do
    after that (rlkit.storage fills in the rest)."""

    exit_code = 74

    def __init__(self, message: str, fix: str = "free space", then: str | None = None) -> None:
        super().__init__(message)
        self.fix, self.then = fix, then

    def __reduce__(self) -> tuple[type, tuple[str, str, str | None]]:  # a demo stage raises it in its own process
        return type(self), (str(self), self.fix, self.then)


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving a checkpoint; the message says how to resume."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # pickled whole: a demo stage raises it in its own process
        return type(self), (str(self), self.exit_code)
