"""The one exception type for mistakes a user can fix (bad recipe, flag or file).

The CLI turns a ``UserError`` into one line on stderr and exit code 2; anything else is a
bug and keeps its traceback.
"""


class UserError(Exception):
    """A problem with the user's input, with the message they need to fix it."""
