"""Store backends: the shared truth about occurrences and runs."""

from .base import Claim, ClaimRequest, ClaimResult, EntryState, StartDecision, Store

__all__ = ["Claim", "ClaimRequest", "ClaimResult", "EntryState", "StartDecision", "Store"]
