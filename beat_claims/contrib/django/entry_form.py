"""The admin's form of an entry defined at run time: its definition's fields as an operator
types them (the schedule, arguments, options and policy as JSON), read into the fields
:class:`beat_claims.entries.Entries` takes. What makes a definition valid is
:mod:`beat_claims.definitions`' to say: its refusals are shown on the field they name
(:meth:`EntryForm.refuse`). A JSON text that does not parse is refused here, named by its
field and where it fails, never by what it holds (arguments may hold secrets)."""

from __future__ import annotations

import json
import re
from typing import Any

from django import forms

from beat_claims.definitions import DefinitionError
from beat_claims.entries import StoredEntry
from beat_claims.settings import entry_name_problem

#: What the Schedule field reads: a definition's JSON form of each kind.
SCHEDULE_HELP = ('JSON: {"every": 30} (seconds), {"crontab": {"minute": "0", "hour": "*/2",'
                 ' "timezone": "Europe/Paris"}} (without a timezone: the app\'s),'
                 ' {"solar": {"event": "sunset", "latitude": 48.85, "longitude": 2.35}},'
                 ' {"clocked": "2027-01-01T00:00:00Z"} (once).')
#: The definition's fields the form edits, in its order (``name`` and ``version`` aside).
FIELDS = ("task", "schedule", "args", "kwargs", "options", "claims", "enabled",
          "description")
#: The first part of a refused field's path: ``schedule.crontab.minute``, ``args[0]``.
_FIELD_ROOT = re.compile(r"[^.\[]*")


class JSONText(forms.CharField):
    """A JSON value typed as text; empty is the field left out (None) unless required."""

    def __init__(self, label: str, example: str, **kwargs: Any) -> None:
        super().__init__(label=label, strip=True, widget=forms.Textarea(attrs={
            "rows": 2, "cols": 70, "class": "vLargeTextField", "placeholder": example,
            "spellcheck": "false"}), error_messages={
            "required": f"{label}: required (JSON, as {example})"}, **kwargs)

    def to_python(self, value: Any) -> Any:
        text = super().to_python(value)
        if text in self.empty_values:
            return None
        try:
            return json.loads(text, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as exc:  # (its message quotes nothing of the text)
            raise forms.ValidationError(
                f"{self.label}: not JSON ({exc.msg}: line {exc.lineno} column {exc.colno})"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise forms.ValidationError(f"{self.label}: not JSON ({exc})") from None

    def prepare_value(self, value: Any) -> Any:
        """The initial value of an edit (a Python value) shown as JSON text; what was typed
        shown as it was."""
        if isinstance(value, str) or value is None:
            return value
        return json.dumps(value, ensure_ascii=False)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object whose key appears twice is refused (json keeps the last one silently)."""
    keys = [key for key, _ in pairs]
    twice = next((key for i, key in enumerate(keys) if key in keys[:i]), None)
    if twice is not None:
        raise ValueError(f"the key {twice[:40]!r} appears twice in one object")
    return dict(pairs)


class EntryForm(forms.Form):
    """An entry's definition. ``name`` only when it is added; ``version``, hidden, only
    when it is edited: the version the edit was read at."""

    name = forms.CharField(label="Name", max_length=200, strip=False, widget=forms.TextInput(
        attrs={"size": 60}))
    task = forms.CharField(label="Task", widget=forms.TextInput(attrs={
        "size": 60, "placeholder": "proj.tasks.report"}))
    schedule = JSONText("Schedule", '{"every": 30}', help_text=SCHEDULE_HELP)
    args = JSONText("Args", '[1, "two"]', required=False,
                    help_text="JSON array of the task's positional arguments.")
    kwargs = JSONText("Kwargs", '{"report": "daily"}', required=False,
                      help_text="JSON object of the task's keyword arguments.")
    options = JSONText("Options", '{"queue": "reports", "priority": 5}', required=False,
                       help_text="JSON object of apply_async options: queue, routing_key,"
                                 " exchange, priority, expires (seconds or an instant),"
                                 " headers, soft_time_limit, time_limit.")
    claims = JSONText("Claims policy", '{"catch_up": "latest"}', required=False,
                      help_text="JSON object of this entry's beat-claims policy (the keys of"
                                " a beat_schedule entry's claims).")
    enabled = forms.BooleanField(label="Enabled", required=False, initial=True)
    description = forms.CharField(label="Description", required=False, widget=forms.Textarea(
        attrs={"rows": 2, "cols": 70, "class": "vLargeTextField"}))
    version = forms.IntegerField(widget=forms.HiddenInput, min_value=1)

    def __init__(self, *args: Any, adding: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.adding = adding
        del self.fields["version" if adding else "name"]

    @classmethod
    def of(cls, entry: StoredEntry) -> EntryForm:
        """The form filled from the entry as the store holds it, at its version."""
        assert entry.definition is not None
        return cls(adding=False, initial={**entry.definition.as_dict(),
                                          "version": entry.version})

    def clean_name(self) -> str:
        name: str = self.cleaned_data["name"]
        problem = entry_name_problem(name)
        if problem is not None:
            raise forms.ValidationError(problem)
        return name

    def definition_fields(self) -> dict[str, Any]:
        """The definition's fields as :class:`Entries` takes them (a field left empty is
        left out: its default on an add, emptied on an edit)."""
        data = self.cleaned_data
        empty: dict[str, Any] = {"args": [], "kwargs": {}, "options": {}, "claims": {}}
        return {f: empty[f] if data[f] is None and f in empty else data[f] for f in FIELDS}

    def refuse(self, exc: Exception) -> None:
        """``exc`` shown on the field it names (a :class:`DefinitionError`'s field), or
        above the form."""
        path = exc.field if isinstance(exc, DefinitionError) else ""
        root = _FIELD_ROOT.match(path)
        field = root.group(0) if root else ""
        self.add_error(field if field in self.fields and field != "version" else None,
                       str(exc))
