"""The in-memory store of Responses API responses (``store: true``), bounded and least recently
used first out, so that ``previous_response_id`` continues a conversation and
``GET /v1/responses/{id}`` finds a response again. Nothing is written to disk; a restart forgets.

Each entry keeps the response object and the conversation it ended (chat-template messages,
without its ``instructions``, which the API does not carry over). A continued conversation's list
shares the earlier entry's message objects, so a long thread costs one list of references per turn;
message dicts are never modified once stored.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from atlas_core.server.schemas_responses import ResponseObject


@dataclass(frozen=True)
class StoredResponse:
    """A finished response and its whole conversation, its own output turn included."""

    response: ResponseObject
    messages: list[dict[str, Any]]


class ResponseStore:
    """At most ``capacity`` responses (0: none are kept); `get` counts as a use."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, entry: StoredResponse) -> None:
        """Keep ``entry`` under its response id, dropping the least recently used beyond capacity."""
        if self.capacity <= 0:
            return
        with self._lock:
            self._entries[entry.response.id] = entry
            self._entries.move_to_end(entry.response.id)
            while len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is not None:
                self._entries.move_to_end(response_id)
            return entry

    def delete(self, response_id: str) -> bool:
        """Forget a response; False when it was not stored."""
        with self._lock:
            return self._entries.pop(response_id, None) is not None

    def __len__(self) -> int:
        return len(self._entries)
