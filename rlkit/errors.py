"""The exception type for mistakes a user can fix (bad recipe, flag or file), and ``BadValue``, its kind for an
argument outside its choices.

The CLI turns a ``UserError`` into one line on stderr and exit code 2; anything else is a
bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, with the message they need to fix it."""


class BadValue(UserError, ValueError):
    """An argument outside what it accepts, named with its choices (a generator's ``wording``, ``size``, ``ops``):
    a ``ValueError`` to a Python caller, one line to the CLI. A plain ``ValueError`` stays a bug."""


class Interrupted(Exception):
    """Training stopped on SIGINT/SIGTERM after saving a checkpoint; the message says how to resume."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self) -> tuple[type, tuple[str, int]]:  # pickled whole: a demo stage raises it in its own process
        return type(self), (str(self), self.exit_code)
