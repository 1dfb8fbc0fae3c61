"""The Store protocol that L1 backends implement (the disk store adds size accounting of its own)."""

from __future__ import annotations

from typing import Protocol


class Store(Protocol):
    """A byte store keyed by digest. Any failure raises StoreUnavailable; a missing key is None/False."""

    def get(self, key: str) -> bytes | None:
        """The stored bytes, or None."""

    def set(self, key: str, value: bytes) -> None:
        """Store, replacing what was there."""

    def add(self, key: str, value: bytes) -> bool:
        """Store only if absent; True if stored."""

    def touch(self, key: str) -> bool:
        """Refresh the key's recency; False if absent."""

    def delete(self, key: str) -> None:
        """Remove the key if present."""

    def close(self) -> None:
        """Release connections."""
