"""The conversation: the session's items in order, and the plain text a request gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..tools import call_text
from ._errors import ClientEventError, quote

Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ROOT = "root"
"""``previous_item_id`` that puts an item at the start of the conversation."""


ItemKind = Literal["text", "audio", "function_call", "function_call_output"]


@dataclass(frozen=True)
class Item:
    """One item of the conversation: a message (text or audio; audio is not kept, only
    its transcript, if known), a function call (the assistant's) or a call's output."""

    id: str
    role: Role
    kind: ItemKind
    text: str | None  # the text, the audio's transcript (None: not known), the call's
    # arguments (JSON) or the call's output
    status: ItemStatus = "completed"
    audio_ms: int = 0  # the assistant's audio (what truncate may cut), in milliseconds
    call_id: str | None = None  # function_call and function_call_output items
    name: str | None = None  # function_call items: the function

    def as_line(self) -> str | None:
        """The item as a line of the conversation's text (None: no text known)."""
        if self.kind == "function_call":
            return f"assistant: {call_text(self.name or '', self.text or '{}')}"
        if self.kind == "function_call_output":
            return f"tool: {self.text}"
        return None if self.text is None else f"{self.role}: {self.text}"


class Conversation:
    """Items in conversation order, bounded in count and text size (the whole
    conversation is sent with every response, so it must not grow without bound)."""

    def __init__(self, max_items: int = 1024, max_bytes: int = 1 << 20) -> None:
        self._items: list[Item] = []
        self._by_id: dict[str, Item] = {}
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._num_bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def last_id(self) -> str | None:
        return self._items[-1].id if self._items else None

    def get(self, item_id: str) -> Item | None:
        return self._by_id.get(item_id)

    def existing(self, item_id: str) -> Item:
        """The item with ``item_id`` (``item_not_found`` if there is none)."""
        item = self._by_id.get(item_id)
        if item is None:
            raise ClientEventError(
                "item_not_found",
                f"item_id {quote(item_id)} names no item of the conversation",
                param="item_id",
            )
        return item

    def _check_room(self, adding: Item, removing: Item | None = None) -> None:
        num_items = len(self._items) + (0 if removing else 1)
        num_bytes = self._num_bytes + _size(adding) - (_size(removing) if removing else 0)
        if num_items > self._max_items or num_bytes > self._max_bytes:
            raise ClientEventError(
                "conversation_too_large",
                f"the conversation would hold {num_items} items and {num_bytes} bytes of text, "
                f"above its limit of {self._max_items} items and {self._max_bytes} bytes; "
                "start a new session",
            )

    @property
    def num_bytes(self) -> int:
        """The conversation's text, in bytes (as its limit counts it)."""
        return self._num_bytes

    @property
    def is_full(self) -> bool:
        return len(self._items) >= self._max_items or self._num_bytes >= self._max_bytes

    def check_room_for_response(self) -> None:
        """Refuse a new response when the conversation is full (its own items are
        added unchecked, so a conversation overshoots by at most one response)."""
        if self.is_full:
            raise ClientEventError(
                "conversation_too_large",
                f"the conversation holds {len(self._items)} items and {self._num_bytes} bytes "
                f"of text, its limit ({self._max_items} items, {self._max_bytes} bytes); "
                "start a new session",
            )

    def add(
        self, item: Item, previous_item_id: str | None = None, *, checked: bool = True
    ) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (the end if None, the start if "root").

        Returns the id of the item now before it.
        """
        if self.get(item.id) is not None:
            raise ClientEventError(
                "duplicate_item_id",
                f"an item with id {quote(item.id)} already exists; leave id out or pick a new one",
                param="item.id",
            )
        if previous_item_id is None:
            index = len(self._items)
        elif previous_item_id == ROOT:
            index = 0
        else:
            found = [i for i, old in enumerate(self._items) if old.id == previous_item_id]
            if not found:
                raise ClientEventError(
                    "item_not_found",
                    f"previous_item_id {quote(previous_item_id)} names no item of the conversation",
                    param="previous_item_id",
                )
            index = found[0] + 1
        if checked:
            self._check_room(item)
        self._items.insert(index, item)
        self._by_id[item.id] = item
        self._num_bytes += _size(item)
        return self._items[index - 1].id if index > 0 else None

    def replace(self, item: Item) -> None:
        """Put ``item`` in the place of the item with its id (server-made: unchecked)."""
        for index, old in enumerate(self._items):
            if old.id == item.id:
                self._items[index] = item
                self._by_id[item.id] = item
                self._num_bytes += _size(item) - _size(old)
                return
        raise KeyError(item.id)

    def remove(self, item_id: str) -> None:
        """Take the item out of the conversation (``item_not_found`` if there is none)."""
        item = self.existing(item_id)
        del self._by_id[item_id]
        self._items.remove(item)
        self._num_bytes -= _size(item)

    def as_text(self) -> str:
        """The conversation as plain text: one ``role: text`` line per item with known text.

        Audio items without a transcript are left out (their audio is not kept).
        """
        lines = (item.as_line() for item in self._items)
        return "\n".join(line for line in lines if line is not None)

    def call(self, call_id: str) -> Item | None:
        """The function_call item with ``call_id``, if there is one."""
        for item in self._items:
            if item.kind == "function_call" and item.call_id == call_id:
                return item
        return None


def played_text(text: str, audio_ms: int, played_ms: int) -> str:
    """The part of ``text`` spoken in the first ``played_ms`` of its ``audio_ms`` of audio.

    Speech runs at a roughly even rate of characters, so the cut is proportional,
    moved back to the end of the last whole word heard."""
    if played_ms >= audio_ms:
        return text
    cut = len(text) * played_ms // audio_ms
    if cut < len(text) and not text[cut].isspace():
        cut = text.rfind(" ", 0, cut) + 1  # 0 when no word was heard whole
    return text[:cut].rstrip()


def _size(item: Item) -> int:
    return len(item.text.encode()) if item.text else 0
