"""The store contract suite: every backend of :mod:`beat_claims.stores.base` passes it.

Tests use only the contract (the ``Store`` methods and dataclasses). Faults a client cannot
cause through the contract (a corrupt record, a wiped or restarted store) are injected
through the few hooks each backend registers next to its factory in ``conftest.py``.
"""
