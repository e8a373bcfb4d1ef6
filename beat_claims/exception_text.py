"""What beat-claims keeps of an exception raised by, or about, a task: the one place that
decides it, for run records and log lines alike.

A task's arguments may hold secrets, and any exception message may quote them (``bad card
4111…``; Celery's ``MaxRetriesExceededError`` prints them all). So a run record keeps the
exception's type always, and its message only when ``beat_claims_exception_messages`` is
on; even then every value of the task's arguments found in it is masked, and the message
is cut to :data:`MESSAGE_LIMIT`. When the arguments cannot be known or walked whole, the
message is not kept: garbled or missing is better than leaked.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from celery.exceptions import MaxRetriesExceededError

from .settings import Settings

#: The longest message kept (characters).
MESSAGE_LIMIT = 500
#: What a masked value becomes.
MASK = "***"
#: Argument values nested deeper than this, or more of them than MAX_VALUES, cannot be
#: walked whole: the message is not kept.
MAX_DEPTH = 8
MAX_VALUES = 1000
#: The characters of a message searched for argument values; a longer message is cut
#: here first (and its last characters masked, where a value may have been cut in two).
SCAN_LIMIT = 20 * MESSAGE_LIMIT
#: Celery's exceptions whose message is built from the task's arguments and nothing the
#: run record lacks (its name and id): never kept, whatever the arguments were.
ARGUMENT_MESSAGES: tuple[type[BaseException], ...] = (MaxRetriesExceededError,)


#: An entry's (args, kwargs) as a beat schedules it, by name; None for an entry it lacks.
EntryArguments = Callable[[str], "tuple[Any, Any] | None"]


@dataclass(frozen=True)
class ExceptionText:
    """An exception as beat-claims records or logs it."""

    type: str
    message: str = ""

    def __str__(self) -> str:
        return f"{self.type}: {self.message}" if self.message else self.type


class _TooMany(Exception):
    """The arguments are nested too deep or hold too many values to be walked whole."""


def recorded_exception(exc: BaseException | Any, args: Any, kwargs: Any,
                       settings: Settings) -> ExceptionText:
    """``exc`` as a run record or a log line about the task keeps it: its class name, and
    its message only with ``settings.exception_messages``, every value of ``args`` and
    ``kwargs`` masked, cut to MESSAGE_LIMIT. ``args`` and ``kwargs`` both None: the
    arguments are unknown, and no message is kept."""
    name = type(exc).__name__
    if not settings.exception_messages or isinstance(exc, ARGUMENT_MESSAGES):
        return ExceptionText(name)
    if args is None and kwargs is None:
        return ExceptionText(name)
    try:
        text = str(exc)
        forms = _forms(args, kwargs)
    except _TooMany:
        return ExceptionText(name)
    except Exception:  # a str() that raises: nothing to keep
        return ExceptionText(name)
    return ExceptionText(name, _masked(text, forms)[:MESSAGE_LIMIT])


def entry_exception(exc: BaseException, known: tuple[Any, Any] | None,
                    settings: Settings) -> ExceptionText:
    """``exc``, raised about an entry whose (args, kwargs) are ``known`` (None: unknown),
    as :func:`recorded_exception` keeps it."""
    args, kwargs = known if known is not None else (None, None)
    return recorded_exception(exc, args, kwargs, settings)


def frames(exc: BaseException) -> str:
    """Where ``exc`` was raised, without any exception's message (a traceback as Python
    prints it ends with the message, and a chained cause repeats its own)."""
    return "".join(traceback.format_tb(exc.__traceback__)).rstrip()


def _forms(args: Any, kwargs: Any) -> set[str]:
    """The texts each argument value may appear as in a message: the str() and repr() of
    every leaf (a bytes value decoded too), walked through lists, tuples, sets and dicts
    (their keys too, below the top level: keyword names are the task's code, not data)
    and other objects' attributes."""
    forms: set[str] = set()
    count = [0]
    for value in _leaves(args if args is not None else (), 0, count):
        _add(forms, value)
    if isinstance(kwargs, Mapping):
        top: Any = list(kwargs.values())
    else:
        top = kwargs if kwargs is not None else ()
    for value in _leaves(top, 0, count):
        _add(forms, value)
    return forms


def _leaves(value: Any, depth: int, count: list[int]) -> Iterator[Any]:
    if isinstance(value, (str, bytes, bytearray, int, float, complex)) or value is None:
        count[0] += 1
        if count[0] > MAX_VALUES:
            raise _TooMany
        yield value
        return
    if depth >= MAX_DEPTH:
        raise _TooMany
    if isinstance(value, Mapping):
        for key, item in list(value.items()):
            if depth > 0:
                yield from _leaves(key, depth + 1, count)
            yield from _leaves(item, depth + 1, count)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in list(value):
            yield from _leaves(item, depth + 1, count)
    else:  # any other object: as it prints, and its attributes' values
        count[0] += 1
        if count[0] > MAX_VALUES:
            raise _TooMany
        yield value
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            for item in list(attributes.values()):
                yield from _leaves(item, depth + 1, count)


def _add(forms: set[str], value: Any) -> None:
    if value is None:
        return  # nothing to hide, and "None" masked would garble every message
    forms.add(str(value))
    forms.add(repr(value))
    if isinstance(value, (bytes, bytearray)):
        forms.add(bytes(value).decode("utf-8", "replace"))
    forms.discard("")


def _masked(text: str, forms: set[str]) -> str:
    """``text`` with every occurrence of any of ``forms`` (overlapping ones included)
    replaced by MASK, one MASK for each run of masked characters."""
    cut = len(text) > SCAN_LIMIT
    text = text[:SCAN_LIMIT]
    hidden = bytearray(len(text))
    for form in forms:
        at = text.find(form)
        while at != -1:
            hidden[at:at + len(form)] = b"\1" * len(form)
            at = text.find(form, at + 1)
    if cut and forms:  # a value may straddle the cut: its first part is masked too
        longest = max(len(form) for form in forms)
        start = max(0, len(text) - longest + 1)
        hidden[start:] = b"\1" * (len(text) - start)
    out: list[str] = []
    i = 0
    while i < len(text):
        if hidden[i]:
            out.append(MASK)
            while i < len(text) and hidden[i]:
                i += 1
        else:
            j = hidden.find(b"\1", i)
            j = len(text) if j == -1 else j
            out.append(text[i:j])
            i = j
    return "".join(out)
