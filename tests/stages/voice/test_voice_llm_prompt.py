"""The LLM's prompt is cut by characters before it is tokenized (stages/voice/llm.py):
round 3, row 10, a 1 MB user message tokenized whole on the stage's thread."""

from __future__ import annotations

from typing import Any

import pytest

from stages.voice.llm_prompt import MAX_CHARS_PER_TOKEN, ChatPrompt, cut_to_chars
from tests.stages.voice.llm_support import run_streams
from tests.voice_support import needs_voice


def test_cut_to_chars_keeps_the_end() -> None:
    messages = [
        {"role": "system", "content": "s" * 10},
        {"role": "user", "content": "u" * 10},
        {"role": "assistant", "content": "a" * 10},
    ]
    assert cut_to_chars(messages, 100) == messages
    assert cut_to_chars(messages, 15) == [
        {"role": "user", "content": "u" * 5},
        {"role": "assistant", "content": "a" * 10},
    ]
    assert cut_to_chars(messages, 10) == [messages[2]]
    assert cut_to_chars(messages, 0) == []


@needs_voice
def test_a_megabyte_message_reaches_the_tokenizer_cut_and_the_turn_ends() -> None:
    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", max_new_tokens=4, dtype="float32")
    seen: list[int] = []
    template = stage.tokenizer.apply_chat_template

    def spy(messages: list[dict[str, str]], **options: Any) -> Any:
        seen.append(sum(len(message["content"]) for message in messages))
        return template(messages, **options)

    stage.tokenizer.apply_chat_template = spy  # the real tokenizer, its input recorded
    history = "user: " + "pod bay doors " * 75_000 + "\nassistant: Sorry."  # ~1 MB
    try:
        texts, _, events = run_streams(stage, {"a": "What is two plus two?"}, history=history)
    finally:
        stage.close()
    assert "a" in texts  # (SmolLM2 answers 768 tokens of "pod bay doors" with nothing)
    assert [event.name for event in events["a"]] == ["llm.finish"]
    assert seen
    assert max(seen) <= stage.max_prompt_tokens * MAX_CHARS_PER_TOKEN


@pytest.mark.parametrize("num_chars", [0, 1, 7])
def test_cut_to_chars_never_keeps_more(num_chars: int) -> None:
    messages = [{"role": "user", "content": "x" * 20}]
    kept = cut_to_chars(messages, num_chars)
    assert sum(len(m["content"]) for m in kept) == num_chars


def test_the_history_window_moves_in_steps_so_the_prompt_prefix_stays() -> None:
    """On llama.cpp (``moving_window``) the kept history starts at a multiple of
    max_history_messages: the next turn's prompt starts with this turn's (a cache hit)
    until the window moves; the other runtimes keep the last max_history_messages."""
    prompt = ChatPrompt(
        None,  # no tokenizer: the window is counted in messages
        max_prompt_tokens=768,
        max_history_messages=4,
        moving_window=True,
        static=False,
        cache_history=True,
    )
    assert [prompt.history_start(n) for n in range(0, 14, 2)] == [0, 0, 0, 4, 4, 8, 8]
    prompt.moving_window = False
    assert [prompt.history_start(n) for n in (2, 6, 8)] == [0, 2, 4]
