"""The conversation: the session's items in order, and the plain text a request gets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ._errors import ClientEventError, quote

Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ROOT = "root"
"""``previous_item_id`` that puts an item at the start of the conversation."""


@dataclass(frozen=True)
class Item:
    """One message of the conversation. Audio is not kept: only its transcript, if known."""

    id: str
    role: Role
    kind: Literal["text", "audio"]
    text: str | None  # the text, or the transcript of the audio (None: not known)
    status: ItemStatus = "completed"


class Conversation:
    """Items in conversation order. Small (one item per turn), so lookups are linear."""

    def __init__(self) -> None:
        self._items: list[Item] = []

    def __len__(self) -> int:
        return len(self._items)

    @property
    def last_id(self) -> str | None:
        return self._items[-1].id if self._items else None

    def get(self, item_id: str) -> Item | None:
        return next((item for item in self._items if item.id == item_id), None)

    def add(self, item: Item, previous_item_id: str | None = None) -> str | None:
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
        self._items.insert(index, item)
        return self._items[index - 1].id if index > 0 else None

    def replace(self, item: Item) -> None:
        """Put ``item`` in the place of the item with its id."""
        for index, old in enumerate(self._items):
            if old.id == item.id:
                self._items[index] = item
                return
        raise KeyError(item.id)

    def as_text(self) -> str:
        """The conversation as plain text: one ``role: text`` line per item with known text.

        Audio items without a transcript are left out (their audio is not kept).
        """
        return "\n".join(
            f"{item.role}: {item.text}" for item in self._items if item.text is not None
        )
