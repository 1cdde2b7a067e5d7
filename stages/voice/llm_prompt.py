"""The voice LLM's prompt (llm.py): the chat (the session's instructions, the earlier
turns from ``Request.text``, the utterance) built with the model's chat template,
its text cut to what ``max_prompt_tokens`` could hold before it is tokenized.

The earlier turns kept are the last ``max_history_messages``; on llama.cpp a window
that moves only every ``max_history_messages`` messages, so the next turn's prompt
starts with this one's (its worker's KV cache is reused up to the new message). On
CTranslate2 the prompt's first tokens, its static prompt (the system message and, with
``cache_history``, the earlier turns), are kept as state (llm_ct2_states.py).
"""

from __future__ import annotations

import json
from typing import Any

from omnitrio.tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

from .llm_answer import Answer
from .payloads import Utterance

DEFAULT_INSTRUCTIONS = (
    "You are a helpful voice assistant. Answer in one or two short, plain sentences."
)
ROLES = ("user", "assistant", "system", "tool")
TOOLS_PROMPT = (
    "You can call these functions:\n<tools>\n{tools}\n</tools>\n"
    "To call one, answer only with "
    + TOOL_CALL_OPEN
    + '{{"name": <function name>, "arguments": <arguments as JSON>}}'
    + TOOL_CALL_CLOSE
    + ". A function's result comes back as a tool message; then answer the user."
)
MAX_CHARS_PER_TOKEN = 8
"""Characters a token of the prompt's text spans, at most for text worth keeping (English
averages ~4); a prompt's text is cut to ``max_prompt_tokens`` times this before it is
tokenized, then to ``max_prompt_tokens`` tokens."""


class ChatPrompt:
    """Builds an answer's prompt ids with the model's tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        max_prompt_tokens: int,
        max_history_messages: int,
        moving_window: bool,
        static: bool,
        cache_history: bool,
    ) -> None:
        self.tokenizer = tokenizer
        self.max_prompt_tokens = max_prompt_tokens
        self.max_history_messages = max_history_messages
        self.moving_window = moving_window  # llama.cpp: the history window moves in steps
        self.static = static  # CTranslate2: the static prompt's length is needed
        self.cache_history = cache_history  # CTranslate2: the history in the static prompt

    @property
    def max_prompt_chars(self) -> int:
        """The characters a prompt of ``max_prompt_tokens`` could need, at most."""
        return self.max_prompt_tokens * MAX_CHARS_PER_TOKEN

    def system(self, answer: Answer) -> str:
        instructions = answer.request.options.instructions
        system = DEFAULT_INSTRUCTIONS if instructions is None else instructions
        if answer.tools:
            described = json.dumps([t.described() for t in answer.tools])
            system += "\n\n" + TOOLS_PROMPT.format(tools=described)
        return system

    def system_ids(self, answer: Answer) -> list[int]:
        """The chat's system message alone, as the prompt starts with it."""
        messages = [{"role": "system", "content": self.system(answer)}]
        ids = self.tokenizer.apply_chat_template(
            cut_to_chars(messages, self.max_prompt_chars), tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    def prompt_ids(self, answer: Answer, utterances: list[Utterance]) -> list[int]:
        """The answer's prompt; sets ``answer.said`` (the chat with this turn's question)
        and ``answer.static_len``."""
        history = parse_history(answer.request.text)
        answer.said = history + [{"role": "user", "content": u.text} for u in utterances if u.text]
        earlier = self.head(answer, history)
        ids = self.chat_ids([*earlier, *answer.said[len(history) :]], generation=True)
        prompt = ids[-self.max_prompt_tokens :]
        if self.static:
            answer.static_len = self.static_len(prompt, earlier)
        return prompt

    def head(self, answer: Answer, history: list[dict[str, str]]) -> list[dict[str, str]]:
        """The prompt's messages before the question: the system message and the
        earlier turns it keeps of ``history``."""
        kept = history[self.history_start(len(history)) :]
        return [{"role": "system", "content": self.system(answer)}, *kept]

    def chat_ids(self, messages: list[dict[str, str]], *, generation: bool) -> list[int]:
        """The chat's ids, its characters first cut to the last ``max_prompt_chars``:
        tokenizing a megabyte took ~0.5 s of this stage's thread, for every client."""
        ids = self.tokenizer.apply_chat_template(
            cut_to_chars(messages, self.max_prompt_chars),
            add_generation_prompt=generation,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]

    def static_len(self, prompt: list[int], head: list[dict[str, str]]) -> int:
        """How many of ``prompt``'s first tokens CTranslate2 takes as the static prompt,
        whose state it keeps (llm_ct2_states.py): the system message and the history
        (``head``), or with ``cache_history`` off the system message alone; 0 where the
        prompt does not start with them (cut to ``max_prompt_tokens``)."""
        for messages in (head, head[:1]) if self.cache_history else (head[:1],):
            static = self.chat_ids(messages, generation=False)
            if prompt[: len(static)] == static and len(static) < len(prompt):
                return len(static)
        return 0

    def next_static(self, answer: Answer) -> list[int] | None:
        """The next turn's static prompt once ``answer`` has ended (this chat with the
        answer in it), to prefill ahead; None where the next prompt is cut at its start
        and will not begin with it."""
        said = [*answer.said, {"role": "assistant", "content": answer.text}]
        head = self.head(answer, said)
        if sum(len(message["content"]) for message in head) >= self.max_prompt_chars:
            return None
        static = self.chat_ids(head, generation=False)
        return None if len(static) >= self.max_prompt_tokens else static

    def history_start(self, num_messages: int) -> int:
        """The first of the ``num_messages`` earlier messages the prompt keeps: the last
        ``max_history_messages``; with ``moving_window`` (llama.cpp) a window that moves
        only every ``max_history_messages`` messages, so the next turn's prompt starts
        with this one's (its worker's KV cache is reused up to the new message) until it
        moves; it then keeps from more than none to ``max_history_messages``."""
        keep = self.max_history_messages
        if num_messages <= keep:
            return 0
        if not self.moving_window or keep < 1:
            return num_messages - keep
        return -(-(num_messages - keep) // keep) * keep  # rounded up to a multiple of keep


def cut_to_chars(messages: list[dict[str, str]], max_chars: int) -> list[dict[str, str]]:
    """``messages`` with at most ``max_chars`` characters of content, kept from the end
    (as the prompt's ids are): the first message kept may lose its start, earlier ones
    are dropped."""
    kept: list[dict[str, str]] = []
    left = max_chars
    for message in reversed(messages):
        content = message["content"]
        if len(content) > left:
            if left > 0:
                kept.append({**message, "content": content[len(content) - left :]})
            break
        kept.append(message)
        left -= len(content)
    return kept[::-1]


def parse_history(text: str) -> list[dict[str, str]]:
    """``role: text`` lines (the Realtime conversation as text) as chat messages;
    a line without a role prefix continues the message before it."""
    messages: list[dict[str, str]] = []
    for line in text.splitlines():
        role, sep, content = line.partition(": ")
        if sep and role in ROLES:
            messages.append({"role": role, "content": content})
        elif messages:
            messages[-1]["content"] += "\n" + line
        elif line.strip():
            messages.append({"role": "user", "content": line})
    return messages
