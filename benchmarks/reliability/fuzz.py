"""Long fuzz runs: the sans-io Realtime protocol and the config loader (issue 7, item 3).

    python benchmarks/reliability/fuzz.py --examples 100000 [--target protocol|config|all]
        [--seed N]

The suite runs the same properties with a few thousand examples and a fixed seed
(tests/runtime/test_config_fuzz.py, tests/realtime/test_realtime_protocol.py); this runs many more,
with random seeds, in batches of fresh hypothesis runs (so memory stays flat).

protocol
    ``RealtimeSession.receive`` in JSON and msgpack sessions, GA and beta
    dialects, small and default size limits: sequences of frames (valid events,
    mutated valid events, arbitrary structures, raw text and bytes, truncated
    and spliced encodings) mixed with what the server does between them
    (``output`` of pipeline items, ``finish`` with any status). ``receive`` must
    never raise; it returns server events that encode, and error events with a
    code and a message; the session's limits hold; and at the end the session
    still serves a turn.
config
    ``parse_config`` on mutated valid configs and arbitrary structures,
    ``load_config`` on arbitrary YAML text and arbitrary file bytes: a
    PipelineConfig or a ``ConfigError`` reading ``SOURCE: KEY: problem``.

Open bugs (``PROTOCOL_KNOWN_BUGS`` here, ``KNOWN_BUGS`` in tests/runtime/test_config_fuzz.py;
both empty now) are counted and
shown with their smallest reproducer, not stopped at, unless ``--strict``. Any
other failure is shrunk by hypothesis and printed with its falsifying example
and a ``@reproduce_failure`` blob. Exit status: 0 clean, 1 a new failure, 2 only
known bugs were hit.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import math
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from omnitrio import AudioChunk, Event, TextDelta, load_config, parse_config  # noqa: E402
from omnitrio.realtime import (  # noqa: E402
    CancelResponse,
    RealtimeSession,
    ServerEvent,
    SessionConfig,
    StartResponse,
)
from tests.runtime import test_config_fuzz as config_fuzz  # noqa: E402

# --- bookkeeping ----------------------------------------------------------------------------


@dataclass
class Tally:
    examples: int = 0
    known: dict[str, int] = field(default_factory=dict)
    smallest: dict[str, str] = field(default_factory=dict)  # bug -> shortest reproducer seen
    current: object = None  # the example being run

    def known_bug(self, name: str) -> None:
        self.known[name] = self.known.get(name, 0) + 1
        text = repr(self.current)
        if name not in self.smallest or len(text) < len(self.smallest[name]):
            self.smallest[name] = text


def _raised_in(error: BaseException, filename: str) -> bool:
    return any(f.filename.endswith(filename) for f in traceback.extract_tb(error.__traceback__))


# The protocol's open bugs: name -> does this exception show it?
PROTOCOL_KNOWN_BUGS: dict[str, Callable[[BaseException], bool]] = {
    # None open. Fixed since the fuzzing found them: a JSON integer over ~1.8e308 where
    # a number is read (OverflowError out of receive); a full conversation making the
    # server's output() / finish() raise ClientEventError("conversation_too_large").
}


def _protocol_known_bug(error: BaseException) -> str | None:
    return next((name for name, shows in PROTOCOL_KNOWN_BUGS.items() if shows(error)), None)


# --- protocol strategies --------------------------------------------------------------------

RATE_HZ = 24000
HUGE_INTS = [10**400, -(10**400), 2**64, 2**63, -(2**63) - 1, 10**308, 2**1024]
EVENT_TYPES = [
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "conversation.item.create",
    "response.create",
    "response.cancel",
    "conversation.item.delete",
    "conversation.item.truncate",
    "transcription_session.update",
    "output_audio_buffer.clear",
]
PROTOCOL_KEYS = [
    *EVENT_TYPES,
    "type",
    "event_id",
    "session",
    "audio",
    "input",
    "output",
    "format",
    "rate",
    "turn_detection",
    "noise_reduction",
    "transcription",
    "voice",
    "speed",
    "id",
    "model",
    "output_modalities",
    "modalities",
    "instructions",
    "temperature",
    "max_output_tokens",
    "max_response_output_tokens",
    "tools",
    "tool_choice",
    "tracing",
    "include",
    "prompt",
    "reasoning",
    "parallel_tool_calls",
    "truncation",
    "input_audio_format",
    "output_audio_format",
    "input_audio_transcription",
    "input_audio_noise_reduction",
    "item",
    "role",
    "object",
    "status",
    "content",
    "text",
    "previous_item_id",
    "response",
    "response_id",
    "metadata",
    "conversation",
]
ITEM_IDS = ["item_1", "item_2", "root", "", "x" * 100]
TRICKY: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    0.5,
    -0.0,
    math.inf,
    -math.inf,
    math.nan,
    1e-320,
    "",
    "\ud800",
    "\x00",
    "x" * 200,
    "inf",
    "auto",
    "none",
    "pcm16",
    "audio/pcm",
    "text",
    "audio",
    "message",
    "user",
    "assistant",
    "system",
    "realtime",
    "transcription",
    "input_text",
    "output_text",
    "input_audio",
    [],
    {},
    ["text"],
    ["audio", "text"],
    ["text", "text"],
    {"type": "audio/pcm", "rate": RATE_HZ},
    {"type": "audio/pcm", "rate": 16000},
    {"id": "v"},
    *ITEM_IDS,
]


def _pcm(samples: int) -> bytes:
    return bytes(range(256)) * (samples * 2 // 256) + bytes(samples * 2 % 256)


def _templates(dialect: str, framing: str) -> list[dict[str, Any]]:
    """One valid event of each kind, every parameter set (so mutations reach deep code)."""
    audio: object = _pcm(240) if framing == "msgpack" else base64.b64encode(_pcm(240)).decode()
    pcm = {"type": "audio/pcm", "rate": RATE_HZ}
    if dialect == "ga":
        session = {
            "type": "realtime",
            "model": "m",
            "output_modalities": ["text"],
            "instructions": "be brief",
            "audio": {
                "input": {
                    "format": pcm,
                    "turn_detection": None,
                    "noise_reduction": None,
                    "transcription": None,
                },
                "output": {"format": pcm, "voice": "alloy", "speed": 1},
            },
            "temperature": 0.8,
            "max_output_tokens": "inf",
            "tools": [],
            "tool_choice": "auto",
            "tracing": None,
            "include": [],
            "truncation": "auto",
            "parallel_tool_calls": False,
        }
        response = {
            "output_modalities": ["audio"],
            "instructions": "shout",
            "audio": {"output": {"format": pcm, "voice": {"id": "v"}}},
            "temperature": 0.5,
            "max_output_tokens": 16,
            "metadata": {"k": "v"},
            "tools": [],
            "tool_choice": "none",
            "conversation": "auto",
            "input": None,
            "prompt": None,
            "parallel_tool_calls": True,
        }
        assistant_part = "output_text"
    else:
        session = {
            "model": "m",
            "modalities": ["text", "audio"],
            "instructions": "be brief",
            "voice": "alloy",
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "turn_detection": None,
            "tools": [],
            "tool_choice": "auto",
            "temperature": 0.7,
            "max_response_output_tokens": "inf",
            "input_audio_transcription": None,
            "input_audio_noise_reduction": None,
            "speed": 1,
            "tracing": None,
        }
        response = {
            "modalities": ["text"],
            "instructions": "shout",
            "voice": "v",
            "temperature": 0.1,
            "max_response_output_tokens": 5,
            "output_audio_format": "pcm16",
            "metadata": {"k": "v"},
            "conversation": "auto",
        }
        assistant_part = "text"
    item = {
        "type": "message",
        "role": "user",
        "id": "item_1",
        "object": "realtime.item",
        "status": "completed",
        "content": [{"type": "input_text", "text": "hello"}],
    }
    assistant = {**item, "role": "assistant", "id": "item_2"}
    assistant["content"] = [{"type": assistant_part, "text": "hi"}]
    return [
        {"type": "session.update", "event_id": "e1", "session": session},
        {"type": "input_audio_buffer.append", "audio": audio},
        {"type": "input_audio_buffer.commit"},
        {"type": "input_audio_buffer.clear"},
        {"type": "conversation.item.create", "item": item},
        {"type": "conversation.item.create", "previous_item_id": "root", "item": assistant},
        {"type": "response.create", "response": response},
        {"type": "response.create"},
        {"type": "response.cancel"},
        {"type": "response.cancel", "response_id": "resp_1"},
    ]


def _tricky(framing: str) -> st.SearchStrategy[object]:
    # Fresh copies: a mutation must not change the list and dict values here.
    values = TRICKY + HUGE_INTS if framing == "json" else TRICKY
    return st.sampled_from(values).map(copy.deepcopy)


def _hostile(framing: str) -> st.SearchStrategy[object]:
    """Values that break a check when they land on the right parameter."""
    values: list[object] = [
        None,
        True,
        0,
        -1,
        -0.0,
        1e-320,
        1e308,
        math.inf,
        math.nan,
        "",
        "\ud800",
        "x" * 10_000,
        [],
        {},
        [None],
        {"": None},
        {"type": "audio/pcm", "rate": 1},
    ]
    if framing == "json":
        values += [10**400, -(10**400), 2**1024, 2**64, -(2**63) - 1]
    else:
        values += [2**64 - 1, -(2**63), b"", b"\x00" * 3, msgpack.ExtType(1, b"")]
    return st.sampled_from(values).map(copy.deepcopy)


def _values(framing: str) -> st.SearchStrategy[object]:
    ints = (
        (st.integers() | st.sampled_from(HUGE_INTS))
        if framing == "json"
        else st.integers(-(2**63), 2**64 - 1)
    )
    scalars = (
        st.none() | st.booleans() | ints | st.floats() | st.text(max_size=16) | _tricky(framing)
    )
    if framing == "msgpack":
        scalars = (
            scalars
            | st.binary(max_size=16)
            | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8))
            | st.just(msgpack.Timestamp(1, 2))
        )
    keys = st.sampled_from(PROTOCOL_KEYS) | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
        max_leaves=12,
    )


# Frames no structure strategy makes (by name, so that hypothesis prints short reprs).
RAW_FRAMES: dict[str, str | bytes] = {
    "json nested 100k deep": "[" * 100_000,
    "json objects 50k deep": '{"a":' * 50_000,
    "json int of 5000 digits": "1" * 5000,
    "json int of 400 digits": "-" + "9" * 400,
    "json 1e999": "1e999",
    "json NaN": "NaN",
    "json lone surrogate": '"\\ud800"',
    "json with BOM": "\ufeff{}",
    "msgpack nested 100k deep": b"\x91" * 100_000,
    "msgpack array32 of 4G entries, then nothing": b"\xdd\xff\xff\xff\xff",
    "msgpack bin32 of 4 GiB, then nothing": b"\xc6\xff\xff\xff\xff",
    "msgpack map16 with int key": b"\xde\x00\x01\x01\x01",
    "empty": b"",
}


def _plain(value: object) -> object:
    """What JSON or msgpack cannot carry as is (bytes in JSON, a stray type), as text."""
    if isinstance(value, bytes):
        return value.decode("latin-1")
    return repr(value)


def _encode(message: object, framing: str, variant: int) -> str | bytes:
    if framing == "json":
        return json.dumps(message, ensure_ascii=bool(variant & 1), allow_nan=True, default=_plain)
    packed: bytes = msgpack.packb(
        message, use_bin_type=bool(variant & 1), unicode_errors="surrogatepass", default=_plain
    )
    return packed


def weighted(choices: list[tuple[int, st.SearchStrategy[Any]]]) -> st.SearchStrategy[Any]:
    """One of the strategies, picked in proportion to its weight (``st.one_of`` picks
    by hypothesis's own taste, which starves the deep, productive kinds)."""
    table = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.sampled_from(range(len(table))).flatmap(table.__getitem__)


def frames(framing: str, dialect: str) -> st.SearchStrategy[str | bytes]:
    """Client frames for a session with this framing (and a few of the other kind)."""
    values = _values(framing)
    valid = st.sampled_from(_templates(dialect, framing))
    events = weighted(
        [
            (1, valid),
            # One hostile value anywhere in a valid event: it reaches every check.
            (5, config_fuzz.one_value_replaced(valid, _hostile(framing))),
            (
                3,
                config_fuzz.mutated(
                    valid,
                    key_names=PROTOCOL_KEYS,
                    keys=st.sampled_from(PROTOCOL_KEYS) | st.text(max_size=8),
                    values=values,
                    tricky=_tricky(framing),
                ),
            ),
            (
                1,
                st.builds(
                    lambda name, more: {"type": name, **more},
                    st.sampled_from(EVENT_TYPES) | st.text(max_size=12),
                    st.dictionaries(st.sampled_from(PROTOCOL_KEYS), values, max_size=4),
                ),
            ),
            (1, values),
        ]
    )
    encoded = st.builds(lambda e, v: _encode(e, framing, v), events, st.integers(0, 1))
    broken = st.builds(
        lambda frame, cut, junk: frame[:cut] + junk + frame[cut:],
        encoded,
        st.integers(0, 200),
        st.text(max_size=3) if framing == "json" else st.binary(max_size=3),
    ).filter(lambda f: isinstance(f, str | bytes))
    raw = st.one_of(
        st.text(max_size=64),
        st.binary(max_size=64),
        st.sampled_from(sorted(RAW_FRAMES)).map(RAW_FRAMES.__getitem__),
    )
    other = "msgpack" if framing == "json" else "json"
    return weighted(
        [
            (8, encoded),
            (1, broken),
            (1, raw),
            (1, st.builds(lambda e: _encode(e, other, 0), valid)),  # the wrong frame type
        ]
    )


@dataclass(frozen=True)
class ProtocolCase:
    framing: str
    dialect: str
    max_message_bytes: int
    max_input_audio_s: float
    max_conversation_items: int
    max_conversation_bytes: int
    actions: list[tuple[Any, ...]]


visible_items = st.one_of(
    st.builds(TextDelta, st.text(max_size=16)),
    st.builds(AudioChunk, st.binary(max_size=64), st.just(RATE_HZ)),
    st.builds(
        Event,
        st.sampled_from(["transcript", "turn", ""]),
        st.dictionaries(
            st.sampled_from(["text", "x"]), st.text(max_size=8) | st.integers(), max_size=2
        ),
    ),
)


def _actions(framing: str, dialect: str) -> st.SearchStrategy[tuple[Any, ...]]:
    return weighted(
        [
            (3, st.tuples(st.just("frame"), frames(framing, dialect))),
            (1, st.tuples(st.just("output"), visible_items)),
            (
                1,
                st.tuples(
                    st.just("finish"),
                    st.sampled_from(["completed", "cancelled", "failed", "incomplete"]),
                    st.none() | st.text(max_size=8),
                ),
            ),
        ]
    )


# Built once: building strategies per example costs more than running the example.
_ACTIONS = {(f, d): _actions(f, d) for f in ("json", "msgpack") for d in ("ga", "beta")}


@st.composite
def protocol_cases(draw: st.DrawFn) -> ProtocolCase:
    framing = draw(st.sampled_from(["json", "msgpack"]))
    dialect = draw(st.sampled_from(["ga", "beta"]))
    action = _ACTIONS[framing, dialect]
    return ProtocolCase(
        framing=framing,
        dialect=dialect,
        max_message_bytes=draw(st.sampled_from([1 << 20, 1 << 20, 4096, 64])),
        max_input_audio_s=draw(st.sampled_from([60.0, 0.05])),
        max_conversation_items=draw(st.sampled_from([1024, 3])),
        max_conversation_bytes=draw(st.sampled_from([1 << 20, 200])),
        actions=draw(st.lists(action, max_size=8)),
    )


RESULTS = (ServerEvent, StartResponse, CancelResponse)


def _check_events(session: RealtimeSession, events: list[Any]) -> None:
    assert isinstance(events, list), events
    for event in events:
        assert isinstance(event, RESULTS), event
        if not isinstance(event, ServerEvent):
            continue
        wire = session.encode(event)
        decoded = json.loads(wire) if isinstance(wire, str) else msgpack.unpackb(wire)
        assert decoded["type"] == event.type
        if event.type == "error":
            error = decoded["error"]
            assert isinstance(error["code"], str)
            assert error["code"]
            assert isinstance(error["message"], str)
            assert error["message"]


def run_protocol_case(
    case: ProtocolCase, on_action: Callable[[object], None] | None = None
) -> None:
    config = SessionConfig(
        session_id="sess_fuzz",
        model="m",
        framing=case.framing,  # type: ignore[arg-type]
        dialect=case.dialect,  # type: ignore[arg-type]
        output_sample_rate_hz=RATE_HZ,
        input_sample_rate_hz=RATE_HZ,
        max_message_bytes=case.max_message_bytes,
        max_input_audio_s=case.max_input_audio_s,
        max_conversation_items=case.max_conversation_items,
        max_conversation_bytes=case.max_conversation_bytes,
    )
    session = RealtimeSession(config)
    _check_events(session, session.start())
    for action in case.actions:
        if on_action is not None:
            on_action(action)
        rid = session.active_response_id
        if action[0] == "frame":
            _check_events(session, session.receive(action[1]))
        elif rid is not None and action[0] == "output":
            _check_events(session, session.output(rid, action[1]))
        elif rid is not None:
            _check_events(session, session.finish(rid, action[1], action[2]))
        stats = session.statistics()
        held = stats.input_audio_buffered_s + stats.input_audio_committed_s
        assert held <= case.max_input_audio_s + 1 / RATE_HZ, stats
        assert stats.num_items <= case.max_conversation_items, stats
    # Whatever came before, the session still serves a turn.
    if on_action is not None:
        on_action(("final turn: finish, response.create, output, finish", case))
    rid = session.active_response_id
    if rid is not None:
        _check_events(session, session.finish(rid, "completed"))
    create = _encode({"type": "response.create"}, case.framing, 1)
    out = session.receive(create)
    _check_events(session, out)
    starts = [o for o in out if isinstance(o, StartResponse)]
    if not starts:  # a full conversation refuses new responses; the session goes on
        codes = [o.fields["error"]["code"] for o in out if isinstance(o, ServerEvent)]  # type: ignore[index]
        assert codes == ["conversation_too_large"], out
        clear = session.receive(_encode({"type": "input_audio_buffer.clear"}, case.framing, 1))
        assert [o.type for o in clear if isinstance(o, ServerEvent)] == [
            "input_audio_buffer.cleared"
        ], clear
        return
    assert len(starts) == 1, out
    _check_events(session, session.output(starts[0].response_id, TextDelta("ok")))
    done = session.finish(starts[0].response_id, "completed")
    _check_events(session, done)
    assert isinstance(done[-1], ServerEvent)
    assert done[-1].type == "response.done"


# --- targets --------------------------------------------------------------------------------

HYPOTHESIS = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "report_multiple_bugs": False,
    "suppress_health_check": list(HealthCheck),
}


def protocol_test(tally: Tally, examples: int, strict: bool) -> Callable[[], None]:
    @settings(**HYPOTHESIS, max_examples=examples)
    @given(case=protocol_cases())
    def protocol(case: ProtocolCase) -> None:
        tally.examples += 1
        tally.current = case
        try:
            run_protocol_case(case, on_action=lambda action: setattr(tally, "current", action))
        except Exception as error:
            bug = _protocol_known_bug(error)
            if strict or bug is None:
                raise
            tally.known_bug(bug)

    return protocol


def config_test(tally: Tally, examples: int, strict: bool, path: Path) -> Callable[[], None]:
    inputs = st.one_of(
        st.tuples(st.just("parse"), config_fuzz.mutated_configs()),
        st.tuples(st.just("parse"), config_fuzz.valid_configs()),
        st.tuples(st.just("parse"), config_fuzz.structures),
        st.tuples(
            st.just("load"),
            config_fuzz.yaml_texts.map(lambda text: text.encode("utf-8", "surrogatepass")),
        ),
        st.tuples(st.just("load"), config_fuzz.file_bytes),
    )

    def known(bug: str) -> None:
        if strict:
            raise AssertionError(f"known bug: {bug}")
        tally.known_bug(bug)

    @settings(**HYPOTHESIS, max_examples=examples)
    @given(case=inputs)
    def config(case: tuple[str, Any]) -> None:
        tally.examples += 1
        kind, value = case
        tally.current = case
        if kind == "parse":
            config_fuzz.check_outcome(
                lambda: parse_config(value, source="<fuzz>"), "<fuzz>", on_known_bug=known
            )
        else:
            path.write_bytes(value)
            config_fuzz.check_outcome(lambda: load_config(path), str(path), on_known_bug=known)

    return config


def run_target(
    name: str, build: Callable[[Tally, int], Callable[[], None]], args: argparse.Namespace
) -> tuple[Tally, BaseException | None, float]:
    tally = Tally()
    started = time.monotonic()
    batch = 0
    failure: BaseException | None = None
    while tally.examples < args.examples:
        before = tally.examples
        size = min(args.batch, args.examples - tally.examples)
        test = seed(args.seed + batch)(build(tally, size))
        batch += 1
        try:
            test()
        except Exception as error:
            failure = error
            print(f"\n{name}: FAILURE (seed {args.seed + batch - 1}):", flush=True)
            traceback.print_exception(error)
            break
        elapsed = time.monotonic() - started
        print(
            f"{name}: {tally.examples} examples, {elapsed:.0f} s, "
            f"{tally.examples / elapsed:.0f}/s, known bugs {tally.known or 'none'}",
            flush=True,
        )
        if tally.examples == before:
            break  # hypothesis found nothing more to try
    return tally, failure, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=100_000, help="examples per target")
    parser.add_argument("--target", choices=["protocol", "config", "all"], default="all")
    parser.add_argument("--seed", type=int, default=None, help="first batch's seed (random)")
    parser.add_argument("--batch", type=int, default=10_000, help="examples per hypothesis run")
    parser.add_argument(
        "--strict", action="store_true", help="stop at known bugs too, with a shrunk reproducer"
    )
    args = parser.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**32)
    print(f"seed {args.seed}; rerun with --seed {args.seed} to repeat", flush=True)
    targets = ["protocol", "config"] if args.target == "all" else [args.target]
    status = 0
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "pipeline.yaml"
        builders: dict[str, Callable[[Tally, int], Callable[[], None]]] = {
            "protocol": lambda tally, n: protocol_test(tally, n, args.strict),
            "config": lambda tally, n: config_test(tally, n, args.strict, path),
        }
        results = {name: run_target(name, builders[name], args) for name in targets}
    print("\nsummary")
    for name, (tally, failure, elapsed) in results.items():
        verdict = "FAILED" if failure else ("known bugs hit" if tally.known else "clean")
        print(f"  {name}: {tally.examples} examples in {elapsed:.1f} s: {verdict}")
        for bug, count in tally.known.items():
            print(f"    known bug {bug!r}: {count} examples; smallest: {tally.smallest[bug][:400]}")
        if failure:
            status = 1
        elif tally.known and status == 0:
            status = 2
    return status


if __name__ == "__main__":
    sys.exit(main())
