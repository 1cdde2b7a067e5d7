"""Constrained decoding: a grammar (from a tool's JSON schema) as a ``Sampler`` constraint.

Built on llguidance (its Lark dialect embeds JSON schemas with ``%json``); the
tool-call grammar's text, and the rules tools meet, are omnitrio's
(``omnitrio.tools.tool_call_lark``, ``omnitrio.tools.check_tools``). A
``Grammar`` is compiled once per request from the stage's tokenizer; each
stream gets its own ``GrammarConstraint`` (a matcher with the stream's
position in the grammar). The sampler masks every token the grammar does not
allow next, so whatever the model prefers, the text it produces parses: a
tool call's arguments validate against the tool's schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import llguidance
import llguidance.hf
import numpy as np
import torch

from omnitrio.tools import FunctionTool, tool_call_lark


class Constraint(Protocol):
    """What ``Sampler`` asks of a per-stream constraint (see ``Sampler.pick``)."""

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        """scores: [1, V] -> the same with every token not allowed next at -inf."""
        ...

    def advance(self, token: int) -> None:
        """The token that was picked."""
        ...

    @property
    def is_complete(self) -> bool:
        """True once the grammar has ended: nothing more may be generated."""
        ...


class GrammarError(ValueError):
    """A tool's schema (or a grammar built from it) that cannot be compiled; names the tool."""


class Vocabulary:
    """A Hugging Face tokenizer as llguidance sees it (converted once; ~1 s)."""

    def __init__(self, hf_tokenizer: Any) -> None:
        self.tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer)


class Grammar:
    """A compiled grammar; ``constraint()`` starts a stream at its beginning."""

    def __init__(self, vocabulary: Vocabulary, lark: str) -> None:
        self._vocabulary = vocabulary
        self._grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        error = llguidance.LLMatcher.validate_grammar(self._grammar, vocabulary.tokenizer)
        if error:
            raise GrammarError(error)

    def constraint(self) -> GrammarConstraint:
        return GrammarConstraint(llguidance.LLMatcher(self._vocabulary.tokenizer, self._grammar))


class GrammarConstraint:
    """One stream's position in a grammar; a ``Constraint``."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher
        if matcher.is_error():
            raise GrammarError(matcher.get_error())

    def mask(self, scores: torch.Tensor) -> torch.Tensor:
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.unpackbits(bits, bitorder="little").astype(bool)  # [>= V]
        vocab = scores.shape[-1]
        blocked = torch.ones(vocab, dtype=torch.bool)
        allowed_t = torch.from_numpy(allowed[:vocab])
        blocked[: allowed_t.shape[0]] = ~allowed_t
        return scores.masked_fill(blocked[None, :], -float("inf"))

    def advance(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise GrammarError(f"token {token} is not allowed here: {self._matcher.get_error()}")

    @property
    def is_complete(self) -> bool:
        return bool(self._matcher.is_stopped())


def tool_call_grammar(vocabulary: Vocabulary, tools: Sequence[FunctionTool]) -> Grammar:
    """One call to any of ``tools`` (``omnitrio.tools.tool_call_lark``) for the vocabulary."""
    if not tools:
        raise GrammarError("a tool call needs at least one tool")
    try:
        return Grammar(vocabulary, tool_call_lark(tools))
    except (GrammarError, ValueError, RuntimeError) as exc:
        names = ", ".join(repr(t.name) for t in tools)
        raise GrammarError(f"the parameters schema of {names} cannot be compiled: {exc}") from None
