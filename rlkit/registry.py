"""Names -> things (tasks, environments, rewards, trainer builders), with one "did you mean" for every slip.

A :class:`Registry` holds the real objects, so a reader (or an IDE) follows a name straight to its code;
the modules registered import nothing heavy at module level. An unknown name is one :class:`UserError`
line: the closest valid name, then all of them.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Iterator
from typing import Any, Generic, TypeVar, overload

from rlkit.errors import UserError

T = TypeVar("T")
D = TypeVar("D")
_MISSING: Any = object()


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Registry(Generic[T]):
    """A named set of ``kind`` (``task``, ``environment``...): ``get(name)`` or a one-line error.

    ``also`` ends the list of valid names in that error, for registries that accept more than their
    names (rewards: ``, or package.module:function``). Items can be added like a dict's (plugins, tests).
    """

    def __init__(self, kind: str, entries: dict[str, T], *, also: str = "") -> None:
        self.kind = kind
        self.also = also
        self._entries = dict(entries)

    @overload
    def get(self, name: str) -> T: ...

    @overload
    def get(self, name: str, default: D) -> T | D: ...

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The entry called ``name``; for an unknown name ``default`` when given (like ``getattr``), else
        a :class:`UserError` naming the closest valid name and all of them."""
        if name in self._entries:
            return self._entries[name]
        if default is not _MISSING:
            return default
        raise UserError(self.unknown(name))

    def unknown(self, name: str) -> str:
        """The message for a name that is not registered."""
        return f"unknown {self.kind} {name!r}{did_you_mean(name, self._entries)}; valid: {', '.join(self.names())}" \
               f"{self.also}"

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __setitem__(self, name: str, entry: T) -> None:
        self._entries[name] = entry

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {self.names()})"
