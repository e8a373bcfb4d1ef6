"""The schedule entry a beat runs: Celery's, with the entry's ``claims`` policy overrides."""

from __future__ import annotations

from typing import Any

from celery.beat import ScheduleEntry


class ClaimsEntry(ScheduleEntry):
    """A schedule entry that also carries its ``claims`` policy overrides."""

    def __init__(self, *args: Any, claims: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.claims = claims
        super().__init__(*args, **kwargs)

    def __reduce__(self) -> Any:
        cls, args = super().__reduce__()[:2]
        return _rebuild_entry, (cls, args, self.claims)

    def update(self, other: ScheduleEntry) -> None:
        super().update(other)
        self.claims = getattr(other, "claims", None)

    def editable_fields_equal(self, other: Any) -> bool:
        return bool(super().editable_fields_equal(other)) and (
            self.claims == getattr(other, "claims", None))


def _rebuild_entry(cls: type, args: tuple[Any, ...], claims: Any) -> ClaimsEntry:
    entry: ClaimsEntry = cls(*args)
    entry.claims = claims
    return entry
