"""The voice stages on their own, called the way the runtime calls them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from omnitrio import Event, Request, ResponseOptions, StreamWork, TextDelta
from stages.voice.phrases import PhraseSplitter
from tests.stages.voice.llm_support import run_streams
from tests.voice_support import INPUT_RATE_HZ, needs_voice, spoken


def test_phrases_end_at_sentence_ends_long_commas_and_the_word_limit() -> None:
    splitter = PhraseSplitter(min_comma_words=3, max_words=6)
    tokens = ["Hi", ",", " there", ".", " Cats", " eat", " meat", ",", " fish", " and", " more"]
    phrases = [p for token in tokens for p in splitter.feed(token)]
    # "Hi," is too short to stand alone.
    assert phrases == ["Hi, there.", "Cats eat meat,"]
    assert splitter.feed(" :)") == []
    assert splitter.flush() == "fish and more :)"
    assert splitter.flush() is None
    splitter = PhraseSplitter(max_words=3, first_max_words=2)
    assert splitter.feed("one two three four five six seven ") == ["one two", "three four five"]


def _fed(splitter: PhraseSplitter, tokens: list[str]) -> list[list[str]]:
    """What each token, fed in turn, completed."""
    return [splitter.feed(token) for token in tokens]


def test_a_sentence_end_ends_a_phrase_without_waiting_for_the_next_tokens_space() -> None:
    """SmolLM2 writes "Luna" "." " The": the full stop ends the phrase as it comes, not
    when the next token (~0.1-0.4 s later at four conversations) brings the space."""
    splitter = PhraseSplitter()
    assert _fed(splitter, ["Her", " name", " is", " Luna", "."]) == [
        [],
        [],
        [],
        [],
        ["Her name is Luna."],
    ]
    assert _fed(splitter, [" The", " End", "!"]) == [[], [], ["The End!"]]
    assert _fed(splitter, [" Really", "?!"]) == [[], ["Really?!"]]
    assert _fed(splitter, [" Call", " her", ' "', "L", "una", '."']) == [[]] * 5 + [
        ['Call her "Luna."']
    ]
    assert _fed(splitter, [" It", "'s", " short", " (", "Rex", ".)"]) == [[]] * 5 + [
        ["It's short (Rex.)"]
    ]
    assert _fed(splitter, [" We", "'re", " well", "-known", "."])[-1] == ["We're well-known."]
    assert splitter.flush() is None


@pytest.mark.parametrize(
    "tokens",
    [
        [" It", " is", " ", "3", "."],  # "3.5"
        [" Buy", " v", "2", "."],  # "v2.0"
        [" Use", " e", "."],  # "e.g."
        [" Use", " e", ".", "g", "."],  # "e.g." goes on: "e.g. salt"
        [" Ask", " Dr", "."],  # "Dr. Smith"
        [" Apples", " and", " pears", " etc", "."],
        [" In", " the", " U", ".", "S", "."],
        [" Wait", "..."],
        [" See", " www", "."],  # "www.example.com"
        [" Say", " I", "."],  # an initial
    ],
)
def test_a_full_stop_after_a_number_a_letter_or_an_abbreviation_waits(tokens: list[str]) -> None:
    """Where the text may go on after the full stop ("3." "5", "e." "g.", "Dr." " Smith",
    "U.S", "...", "www." "example"), the phrase waits for the space as before."""
    splitter = PhraseSplitter(min_comma_words=9)
    assert _fed(splitter, tokens) == [[]] * len(tokens)
    assert splitter.feed("5 more") == []  # no space after the full stop: it went on


def test_what_a_sentence_end_cut_as_it_comes_leaves_alone_is_not_a_phrase() -> None:
    """ "Really" "?" "!": the phrase ends at "?", and the "!" (or a closing quote, "..")
    that the next token brings has nothing to say: it is not synthesised alone."""
    splitter = PhraseSplitter()
    assert [p for t in ["Really", "?", "!", " Yes", "."] for p in splitter.feed(t)] == [
        "Really?",
        "Yes.",
    ]
    assert [
        p
        for t in [" Call", " her", " Luna", ".", '"', " It", " fits", "."]
        for p in splitter.feed(t)
    ] == [
        "Call her Luna.",
        '" It fits.',
    ]
    assert splitter.feed('"') == []
    assert splitter.flush() is None
    assert splitter.feed(" Well") == []
    assert splitter.feed(".") == ["Well."]
    assert splitter.feed("..") == []
    assert splitter.flush() is None


def test_a_full_stop_after_a_capitalised_two_letter_word_waits_for_the_space() -> None:
    """ "Ph" "." "D" "." " degree": "Ph." may go on, so it is not cut there."""
    splitter = PhraseSplitter(min_comma_words=9)
    assert [
        p for t in [" A", " Ph", ".", "D", ".", " degree", " helps", "."] for p in splitter.feed(t)
    ] == ["A Ph.D.", "degree helps."]  # as before: "Ph.D." whole, its space taken as an end


def test_a_first_boundary_minimum_holds_the_early_boundary_cut_too() -> None:
    """With first_min_words 2 and first_boundary_min_words 6, "A b c d | of" is not cut
    at "of": the first phrase keeps six words."""
    splitter = PhraseSplitter(first_min_words=2, first_max_words=8, first_boundary_min_words=6)
    tokens = ["Cats", " like", " fish", " a", " lot", " and", " dogs", " like", " meat", " more"]
    assert [p for t in tokens for p in splitter.feed(t)] == ["Cats like fish a lot and dogs like"]


def test_the_first_phrases_length_cut_keeps_first_boundary_min_words() -> None:
    """first_boundary_min_words: "A good name | for ..." left a first phrase of three
    words, no longer than its first part; with 4 it runs on to its length limit."""
    tokens = ["A", " good", " name", " for", " a", " small", " dog", " could", " be"]
    kept = PhraseSplitter(first_max_words=8, first_min_words=4, first_part_words=3)
    assert [p for t in tokens for p in kept.feed(t)] == ["A good name"]
    at_least = PhraseSplitter(
        first_max_words=8, first_min_words=4, first_part_words=3, first_boundary_min_words=4
    )
    assert [p for t in tokens for p in at_least.feed(t)] == ["A good name for a small dog could"]
    assert at_least.feed(" in the garden ") == []  # a later phrase: the usual cut
    before = PhraseSplitter(first_max_words=6, first_boundary_min_words=3)
    assert before.feed("Cats like to eat fish and meat ") == ["Cats like to eat fish"]


def test_a_cut_for_length_falls_before_a_boundary_word_and_not_after_an_abbreviation() -> None:
    splitter = PhraseSplitter(first_max_words=6)
    text = "Dr. Smith lives in the old house by the river "
    assert splitter.feed(text) == ["Dr. Smith lives"]  # not "Dr." alone, not "... in the"
    assert splitter.flush() == "in the old house by the river"
    splitter = PhraseSplitter(first_max_words=4)
    assert splitter.feed("Cats like to eat fish ") == ["Cats like"]
    assert splitter.feed("and meat. ") == ["to eat fish and meat."]


def test_the_first_phrase_ends_before_a_boundary_word_once_it_has_its_minimum() -> None:
    splitter = PhraseSplitter(first_max_words=8, first_min_words=4)
    assert splitter.feed("Cats like to eat ") == []  # "to" comes after two words only
    assert splitter.feed("fish and") == []  # "and" is not known whole yet
    assert splitter.feed(" meat of all kinds ") == ["Cats like to eat fish"]
    assert splitter.flush() == "and meat of all kinds"  # later phrases wait for their limit


def test_the_first_phrases_first_words_are_offered_once_and_it_holds_them() -> None:
    """first_part_words: the first K words, once they are known whole, before the first
    phrase is complete; after that the first phrase is never cut shorter than K words
    (here a length cut would fall before "in", after three)."""
    splitter = PhraseSplitter(first_max_words=6, first_part_words=4)
    assert splitter.feed("The sun is in") == []
    assert splitter.first_part() is None  # "in" is not known whole yet
    assert splitter.feed(" the ") == []
    assert splitter.first_part() == "The sun is in"
    assert splitter.first_part() is None  # once
    assert splitter.feed("sky all day long ") == ["The sun is in the sky"]
    assert splitter.first_part() is None  # only the first phrase has a part
    unoffered = PhraseSplitter(first_max_words=6)
    assert unoffered.feed("The sun is in the sky all ") == ["The sun is"]
    at_once = PhraseSplitter(first_max_words=6, first_part_words=4)  # text in one piece
    assert at_once.feed("The sun is in the sky all ") == ["The sun is in the sky"]


def test_the_first_phrase_cut_now_ends_at_its_last_whole_word_if_it_holds_the_part() -> None:
    """cut_first (the TTS's first_phrase_cut_s): only an open first phrase whose part
    was offered, and only once its whole words hold the part's."""
    splitter = PhraseSplitter(first_max_words=12, first_part_words=3)
    assert splitter.feed("The sun ") == []
    assert splitter.cut_first() is None  # no part offered yet
    assert splitter.feed("is in th") == []
    assert splitter.first_part() == "The sun is"
    assert splitter.cut_first() == "The sun is in"  # "in" is whole, "th" may go on
    assert splitter.cut_first() is None  # the first phrase is out
    assert splitter.feed("e sky. ") == ["the sky."]
    assert PhraseSplitter(first_max_words=12).cut_first() is None  # no first part at all


def test_a_sentence_or_a_comma_ends_a_phrase_behind_a_closing_quote() -> None:
    """The LLM quotes the names it suggests: 'or "Lady in Red." It' ends a sentence, and
    before, the phrase ran on to the next comma (the answer's audio ran dry meanwhile)."""
    splitter = PhraseSplitter(min_comma_words=2)
    assert splitter.feed('Call her "Lady in Red." It') == ['Call her "Lady in Red."']
    said = splitter.feed('\'s short, or "Max," or (Rex.) ')
    assert said == ["It's short,", 'or "Max,"', "or (Rex.)"]
    assert splitter.flush() is None
    assert PhraseSplitter().feed('Ask "Dr." Smith ') == []  # still an abbreviation


def test_a_later_phrase_cut_now_ends_before_its_last_boundary_word_or_after_its_last_word() -> None:
    """cut_later (the TTS's later_phrase_cut_s): only a later phrase, only once it holds
    two whole words; before the last boundary word that leaves two words before it."""
    splitter = PhraseSplitter(first_max_words=3)
    assert splitter.feed("A good name for a small ") == ["A good name"]
    assert splitter.feed('dog could be "Lil') == []
    assert splitter.cut_later() == "for a small dog could be"  # "for" leaves no words before
    assert splitter.feed('ac" or') == []
    assert splitter.cut_later() is None  # '"Lilac"' alone: one whole word
    assert splitter.feed(' "Max" and "Rex" ') == []
    assert splitter.cut_later() == '"Lilac" or "Max"'  # before "and"
    assert splitter.flush() == 'and "Rex"'
    assert PhraseSplitter().cut_later() is None  # the first phrase is not a later one


@pytest.fixture
def llm() -> Iterator[object]:
    """One per test: its packaging thread (started by the first step) ends with it."""
    from stages.voice.llm import SmolLM2Llm

    # float32: in bf16 the batch's shape changes rounding, and greedy answers may part.
    stage = SmolLM2Llm("llm", max_new_tokens=16, dtype="float32")
    yield stage
    stage.close()


def _answer(stage: object, questions: dict[str, str]) -> dict[str, str]:
    """Run streams to the end together, the way the actor does; their texts."""
    return run_streams(stage, questions)[0]


@needs_voice
def test_batched_decoding_gives_each_stream_its_own_answer(llm: object) -> None:
    questions = {"a": "What do cats like to eat?", "b": "Why is the sky blue? Explain."}
    alone = {sid: _answer(llm, {sid: q})[sid] for sid, q in questions.items()}
    together = _answer(llm, questions)
    assert together == alone  # greedy: the batch changes nothing, padding included
    assert alone["a"] != alone["b"]
    assert llm.streams == {}  # type: ignore[attr-defined]  # every KV cache freed
    # The stage kit's statistics (AutoregressiveStage): tokens, forward time, KV bytes.
    figures = llm.stage_statistics()  # type: ignore[attr-defined]
    assert figures["num_tokens"] > 0
    assert figures["forward_ms_mean"] > 0
    assert figures["kv_bytes"] == 0
    assert figures["num_active_streams"] == 0


@needs_voice
def test_an_answer_that_brings_the_tts_no_text_is_forgotten_at_its_llm_close(
    llm: object,
) -> None:
    # The TTS stage ends a stream that brings it no text without opening it
    # (ends_without_input), so the LLM's close forgets that answer's start
    # (first_audio.py); an answer whose text went on is the TTS's to forget.
    from stages.voice.first_audio import FIRST_AUDIO
    from stages.voice.payloads import Utterance
    from stages.voice.tts import PiperTts

    assert PiperTts.ends_without_input
    FIRST_AUDIO.answer_starting("silent")
    FIRST_AUDIO.answer_starting("spoken")
    try:
        llm.open_stream("silent", Request(options={"task": "transcribe"}))  # type: ignore[attr-defined]
        output = llm.step([StreamWork("silent", (), True)])["silent"]  # type: ignore[attr-defined]
        assert output.done
        assert not output.payloads
        llm.close_stream("silent")  # type: ignore[attr-defined]
        assert "silent" not in FIRST_AUDIO._starting
        assert _answer(llm, {"spoken": "What do cats like to eat?"})["spoken"]
        assert "spoken" in FIRST_AUDIO._starting
        # A text chat: its answer is text alone, so none of it goes to the TTS stage.
        FIRST_AUDIO.answer_starting("typed")
        text_only = Request(options=ResponseOptions(modalities=("text",)))
        llm.open_stream("typed", text_only)  # type: ignore[attr-defined]
        work = StreamWork("typed", (Utterance("What do cats like to eat?"),), True)
        texts, sent = "", 0
        while True:
            output = llm.step([work])["typed"]  # type: ignore[attr-defined]
            texts += "".join(v.text for v in output.visible if isinstance(v, TextDelta))
            sent += len(output.payloads)
            work = StreamWork("typed", (), True)
            if output.done:
                break
        llm.close_stream("typed")  # type: ignore[attr-defined]
        assert texts
        assert sent == 0
        assert "typed" not in FIRST_AUDIO._starting
    finally:
        for sid in ("silent", "spoken", "typed"):
            FIRST_AUDIO.forget(sid)


@needs_voice
def test_the_int8_llm_quantizes_every_linear_layer_and_still_answers() -> None:
    import torch

    from stages.voice.llm import SmolLM2Llm

    stage = SmolLM2Llm("llm", max_new_tokens=12, dtype="int8")
    try:
        linear = [m for m in stage.model.modules() if type(m) is torch.nn.Linear]
        quantized = [m for m in stage.model.modules() if "quantized" in type(m).__module__]
        assert linear == []
        assert len(quantized) > 100  # 30 layers x 7, and the head
        answer = _answer(stage, {"q": "What is the capital of France?"})["q"]
        assert "Paris" in answer
    finally:
        stage.close()


def test_the_llm_on_cuda_without_a_gpu_is_refused_naming_the_stage() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a CUDA GPU")
    from stages._torch_device import DeviceError
    from stages.voice.llm import SmolLM2Llm

    with pytest.raises(DeviceError, match=r"stage 'llm': device 'cuda' needs a CUDA GPU"):
        SmolLM2Llm("llm", "cuda")


@needs_voice
def test_the_llm_on_cuda_answers_as_on_cpu(llm: object) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from stages.voice.llm import SmolLM2Llm

    on_gpu = SmolLM2Llm("llm", "cuda", max_new_tokens=16)
    try:
        question = {"a": "What do cats like to eat?"}
        # bf16 on two devices: the greedy answers agree at least in their first words.
        assert _answer(on_gpu, question)["a"].split()[:3] == _answer(llm, question)["a"].split()[:3]
    finally:
        on_gpu.close()


@needs_voice
def test_a_cancelled_stream_leaves_the_batch_at_the_next_step(llm: object) -> None:
    from stages.voice.payloads import Utterance

    llm.open_stream("x", Request())  # type: ignore[attr-defined]
    llm.open_stream("y", Request())  # type: ignore[attr-defined]
    batch = [StreamWork(s, (Utterance("Tell me a story."),), True) for s in ("x", "y")]
    llm.step(batch)  # type: ignore[attr-defined]
    llm.close_stream("x")  # type: ignore[attr-defined]  # what cancelling does
    outputs = llm.step([StreamWork("y", (), True)])  # type: ignore[attr-defined]
    assert set(outputs) == {"y"}
    assert set(llm.streams) == {"y"}  # type: ignore[attr-defined]
    llm.close_stream("y")  # type: ignore[attr-defined]


@needs_voice
def test_vad_reports_a_pause_and_speech_resuming(tmp_path: Path) -> None:
    from stages.voice.vad import SileroVad

    def trimmed(pcm16: bytes) -> bytes:  # without espeak-ng's own silence around it
        loud = np.nonzero(np.abs(np.frombuffer(pcm16, "<i2")) > 300)[0]
        return pcm16[2 * int(loud[0]) : 2 * (int(loud[-1]) + 1)]

    first = trimmed(spoken("Why is the sky blue,", tmp_path / "a.wav"))
    second = trimmed(spoken("and why are sunsets red?", tmp_path / "b.wav"))
    speech = bytes(2 * INPUT_RATE_HZ // 2) + first + bytes(2 * INPUT_RATE_HZ * 3 // 10) + second
    speech += bytes(2 * INPUT_RATE_HZ)
    chunks = tuple(speech[i : i + 4800] for i in range(0, len(speech), 4800))
    vad = SileroVad("vad", input_sample_rate_hz=INPUT_RATE_HZ, pause_ms=200)
    vad.open_stream("s", Request())
    events = [e for e in vad.step([StreamWork("s", chunks, False)])["s"].visible]
    names = [e.name for e in events if isinstance(e, Event)]
    # At least the 300 ms gap is a pause (short gaps between words may be too), speech
    # resumes after it, and the turn ends once, after the last pause.
    assert names[0] == "speech_started"
    assert names[-2:] == ["speech_paused", "speech_stopped"]
    assert names.count("speech_stopped") == 1
    assert names.count("speech_resumed") == names.count("speech_paused") - 1 >= 1
    last_pause, stopped = events[-2], events[-1]
    assert isinstance(last_pause, Event)
    assert isinstance(stopped, Event)
    assert last_pause.data["audio_end_ms"] == stopped.data["audio_end_ms"]  # the same turn end


@needs_voice
def test_vad_finds_the_turn_and_batches_streams(tmp_path: Path) -> None:
    from stages.voice.vad import SileroVad

    speech = bytes(2 * INPUT_RATE_HZ // 2) + spoken("What do cats like to eat?", tmp_path / "q.wav")
    speech += bytes(2 * INPUT_RATE_HZ)  # 1 s of silence ends the turn
    chunks = tuple(speech[i : i + 4800] for i in range(0, len(speech), 4800))
    vad = SileroVad("vad", input_sample_rate_hz=INPUT_RATE_HZ)
    vad.open_stream("alone", Request())
    alone = vad.step([StreamWork("alone", chunks, False)])["alone"].visible
    calls_alone = vad.num_model_calls
    assert [e.name for e in alone if isinstance(e, Event)] == ["speech_started", "speech_stopped"]
    start_ms, end_ms = alone[0].data["audio_start_ms"], alone[1].data["audio_end_ms"]  # type: ignore[union-attr]
    assert 0 <= start_ms <= 500 < end_ms  # type: ignore[operator]
    # Two streams in one step: the same verdicts, from one ONNX call per window.
    for sid in ("a", "b"):
        vad.open_stream(sid, Request(options={"silence_duration_ms": 500}))
    both = vad.step([StreamWork("a", chunks, False), StreamWork("b", chunks, False)])
    assert both["a"].visible == both["b"].visible == alone
    assert vad.num_model_calls == 2 * calls_alone  # both streams' windows in each call
    vad.close()


@needs_voice
def test_vad_scores_one_stream_on_the_single_window_model_as_on_the_batched_one(
    tmp_path: Path,
) -> None:
    from stages.voice.vad import SileroVad

    speech = spoken("Why is the sky blue, and why are sunsets red?", tmp_path / "q.wav")
    rng = np.random.default_rng(0)
    hiss = (rng.standard_normal(INPUT_RATE_HZ) * 60).astype("<i2").tobytes()  # 1 s, quiet
    # The question twice with a 0.33 s gap, then hiss and digital silence.
    audio = hiss + speech + bytes(2 * INPUT_RATE_HZ // 3) + speech + hiss + bytes(INPUT_RATE_HZ)
    chunks = [audio[i : i + 960] for i in range(0, len(audio), 960)]  # 20 ms, as a client sends

    def heard(vad: SileroVad) -> tuple[list[float], list[object]]:
        probabilities: list[float] = []
        update = vad._update

        def recorded(track: object, probability: float) -> object:
            probabilities.append(probability)
            return update(track, probability)  # type: ignore[arg-type]

        vad._update = recorded  # type: ignore[method-assign,assignment]
        vad.open_stream("s", Request())
        events: list[object] = [
            e for c in chunks for e in vad.step([StreamWork("s", (c,), False)])["s"].visible
        ]
        vad.close_stream("s")
        return probabilities, events

    single = SileroVad("vad", input_sample_rate_hz=INPUT_RATE_HZ, pause_ms=120)
    batched = SileroVad("vad", input_sample_rate_hz=INPUT_RATE_HZ, pause_ms=120)
    assert single._single is not None  # the packaged silero-vad ships it
    batched._single = None
    (p_single, e_single), (p_batched, e_batched) = heard(single), heard(batched)
    assert len(p_single) == len(audio) // 2 * 2 // 3 // 512
    np.testing.assert_allclose(p_single, p_batched, rtol=0, atol=1e-5)
    assert max(p_single) > 0.9  # speech was heard
    assert min(p_single) < 0.1  # and silence
    assert e_single == e_batched
    assert [e.name for e in e_single if isinstance(e, Event)].count("speech_stopped") >= 1


@needs_voice
@pytest.mark.parametrize("rate_hz", [16000, 24000, 32000, 48000])
def test_the_window_gate_never_holds_a_chunk_that_completes_a_window(rate_hz: int) -> None:
    from omnitrio import StreamResampler
    from stages.voice.vad import GATED_RATES_HZ, SileroVad, WindowGate

    assert rate_hz in GATED_RATES_HZ
    rng = np.random.default_rng(rate_hz)
    for sizes in ("20 ms", "any"):
        gate = SileroVad.input_gate({"input_sample_rate_hz": rate_hz})
        assert isinstance(gate, WindowGate)
        resampler = StreamResampler(rate_hz, 16000, quality="QQ")  # the stage's
        num_out, num_held = 0, 0
        for _ in range(3000):
            size = rate_hz // 50 if sizes == "20 ms" else int(rng.integers(1, rate_hz // 10))
            windows_before = num_out // 512
            num_out += resampler.push(rng.standard_normal(size).astype(np.float32)).size
            if not gate.take(size):
                num_held += 1
                assert num_out // 512 == windows_before  # held: it completed no window
        if sizes == "20 ms":
            assert abs(num_held - 3000 // 4) <= 1  # a quarter of a 20 ms stream's steps saved


@needs_voice
def test_the_window_gate_is_off_where_the_resampler_may_run_ahead_or_lag() -> None:
    from stages.voice.vad import SileroVad

    assert SileroVad.input_gate({"input_sample_rate_hz": 44100}) is None  # one ahead at times
    assert SileroVad.input_gate({"input_sample_rate_hz": 8000}) is None  # up to 4 behind
    assert SileroVad.input_gate({}) is not None  # 24 kHz, the default
    with pytest.raises(ValueError, match="input_sample_rate_hz"):
        SileroVad.input_gate({"input_sample_rate_hz": "24000"})


@needs_voice
def test_the_vad_behind_its_window_gate_reports_the_same_events_at_the_same_chunks(
    tmp_path: Path,
) -> None:
    from stages.voice.vad import SileroVad

    speech = spoken("Why is the sky blue, and why are sunsets red?", tmp_path / "q.wav")
    audio = bytes(INPUT_RATE_HZ) + speech + bytes(2 * INPUT_RATE_HZ) + speech  # 1 s apart
    audio += bytes(2 * INPUT_RATE_HZ)
    chunks = [audio[i : i + 960] for i in range(0, len(audio), 960)]  # 20 ms
    vad = SileroVad("vad", input_sample_rate_hz=INPUT_RATE_HZ, pause_ms=120)
    gate = SileroVad.input_gate({"input_sample_rate_hz": INPUT_RATE_HZ})
    assert gate is not None
    vad.open_stream("all", Request())
    vad.open_stream("gated", Request())
    heard: dict[str, list[tuple[int, str, object]]] = {"all": [], "gated": []}
    held: list[bytes] = []
    num_steps = 0
    for index, chunk in enumerate(chunks):
        for event in vad.step([StreamWork("all", (chunk,), False)])["all"].visible:
            assert isinstance(event, Event)
            heard["all"].append((index, event.name, dict(event.data)))
        held.append(chunk)
        if gate.take(len(chunk) // 2):  # what the server does: the held chunks, joined
            joined, held = b"".join(held), []
            num_steps += 1
            for event in vad.step([StreamWork("gated", (joined,), False)])["gated"].visible:
                assert isinstance(event, Event)
                heard["gated"].append((index, event.name, dict(event.data)))
    assert heard["gated"] == heard["all"]
    names = [name for _, name, _ in heard["all"]]
    assert names.count("speech_started") == names.count("speech_stopped") == 2
    assert "speech_paused" in names
    assert num_steps <= len(chunks) * 3 // 4 + 1


@needs_voice
def test_the_vad_keeps_the_last_8_s_of_scored_audio_for_smart_turn() -> None:
    from omnitrio import StreamResampler
    from stages.voice.vad import KEEP_SAMPLES, WINDOW_SAMPLES, _Stream

    track = _Stream(0.5, 15, 300, StreamResampler(24000, 16000))
    rng = np.random.default_rng(0)
    everything = np.zeros(0, np.float32)
    assert track.recent.size == 0
    for index in range(3 * KEEP_SAMPLES // WINDOW_SAMPLES + 7):  # past two moves to the front
        window = rng.standard_normal(WINDOW_SAMPLES).astype(np.float32)
        track.hear(window)
        everything = np.concatenate([everything, window])
        if index % 37 == 0 or index > 3 * KEEP_SAMPLES // WINDOW_SAMPLES:
            np.testing.assert_array_equal(track.recent, everything[-KEEP_SAMPLES:])
    assert track.recent.size == KEEP_SAMPLES


@needs_voice
def test_tts_speaks_the_first_phrase_before_the_text_ends() -> None:
    from stages.voice.payloads import TextPiece
    from stages.voice.tts import PiperTts

    tts = PiperTts("tts")
    tts.open_stream("s", Request())
    first = tts.step([StreamWork("s", (TextPiece("Cats eat meat. They also"),), False)])["s"]
    assert first.visible
    assert not first.done
    audio = first.visible[0]
    assert audio.sample_rate_hz == 22050
    assert len(audio.pcm16) > 22050
    last = tts.step([StreamWork("s", (TextPiece(" like fish"),), True)])["s"]
    assert last.visible
    assert last.done
    tts.close_stream("s")
    tts.close()


@needs_voice
@pytest.mark.parametrize(
    ("impl", "params", "named"),
    [
        ("stages.voice.tts:PiperTts", {"voice_path": "nowhere/voice.onnx"}, "voice_path"),
        ("stages.voice.asr:WhisperAsr", {"model_path": "nowhere/whisper"}, "model_path"),
        ("stages.voice.llm:SmolLM2Llm", {"model_path": "nowhere/llm"}, "model_path"),
        ("stages.voice.llm:SmolLM2Llm", {"model_path": "nowhere/llm.gguf"}, "model_path"),
    ],
)
def test_a_missing_model_file_names_the_param_and_the_path(
    impl: str, params: dict[str, str], named: str
) -> None:
    import importlib

    from stages.voice.files import MissingModelFile

    module, _, name = impl.partition(":")
    stage_class = getattr(importlib.import_module(module), name)
    with pytest.raises(MissingModelFile, match=f"param {named}: .*{params[named]}"):
        stage_class("stage", **params)


@needs_voice
def test_the_cpu_only_voice_stages_refuse_another_device_naming_the_stage() -> None:
    from stages.voice.tts import PiperTts
    from stages.voice.vad import SileroVad

    for stage in (PiperTts, SileroVad):
        with pytest.raises(ValueError, match=r"stage 'x' runs on the CPU only.*'cuda'"):
            stage("x", "cuda")
