"""benchmarks/voice_late_parts.py: the TTS's trace lines read back, and a late part
blamed on its text, its queue or its synthesis."""

from __future__ import annotations

from benchmarks.voice_late_parts import Part, blame, held, late_list, lateness, parts

LOG = """\
voice-part first s1 start=10.0000 end=10.1000 runs_out=0.0000 text=9.9000 prev=0.0000 audio=0.3700
voice-part next s1 start=10.1000 end=10.2000 runs_out=10.4700 text=0.0000 prev=10.1000 audio=0.4000
voice-part next s1 start=11.5000 end=11.7000 runs_out=10.8700 text=11.5000 prev=10.2000 audio=1.4000
"""


def test_parts_reads_the_trace_lines() -> None:
    found = parts(LOG)
    assert [p.kind for p in found] == ["first", "next", "next"]
    assert found[2] == Part("next", "s1", 11.5, 11.7, 10.87, 11.5, 10.2, 1.4)


def test_a_late_part_is_blamed_on_its_longest_wait() -> None:
    def part(start: float, end: float, text: float) -> Part:
        return Part("next", "s", start, end, 1.0, text, 0.5, 1.0)

    assert blame(part(2.0, 2.1, 1.9)) == "text"  # its phrase came 1.4 s after the last part
    assert blame(part(2.0, 2.1, 0.6)) == "queue"  # ready at 0.6, started at 2.0
    assert blame(part(0.6, 2.0, 0.6)) == "synthesis"


def test_a_phrase_the_tts_had_long_after_the_llm_wrote_it_is_blamed_on_its_delivery() -> None:
    """written: the LLM handed the phrase's last piece on at 0.6, 0.1 s after the last
    part was made; the TTS had it at 1.4 (its steps for other answers, the queued round)."""

    def part(written: float) -> Part:
        return Part("next", "s", 1.4, 1.5, 1.0, 1.4, 0.5, 1.0, written)

    assert blame(part(0.6)) == "delivery"
    assert blame(part(1.3)) == "text"  # written 0.8 s after the last part, had 0.1 s later
    assert blame(part(0.0)) == "text"  # an older trace: no LLM time
    line = "voice-part next s1 start=2.0 end=2.1 runs_out=1.0 text=1.9 prev=0.5 audio=1.0"
    assert parts(line + " written=1.2")[0].written_s == 1.2
    assert parts(line)[0].written_s == 0.0


def test_lateness_counts_only_later_parts_late_for_the_buffer_in_the_window() -> None:
    found = parts(LOG)
    seen = lateness(found, 0.0, 100.0, buffer_s=0.2)
    assert seen.num_parts == 2  # the first audio is no later part
    count, late_s = seen.late["text"]  # made at 11.7, due by 10.87 + 0.2
    assert count == 1
    assert abs(late_s - 0.63) < 1e-6
    assert seen.late["queue"] == (0, 0.0)
    assert lateness(found, 0.0, 11.0, buffer_s=0.2).late["text"] == (0, 0.0)  # out of it
    assert lateness(found, 0.0, 100.0, buffer_s=1.0).late["text"] == (0, 0.0)


def test_late_list_names_each_late_part_its_waits_and_its_answers_holds() -> None:
    """s1's third part (its second later part) was made at 11.7, due by 10.87 + 0.2;
    its answer held its tokens 10.5-10.9 and 12.0-12.5 (after the part: not counted)."""
    log = LOG + "voice-held s1 10.500000 10.900000 synth=0;starting=s2\n"
    log += "voice-held s1 12.000000 12.500000 synth=0;starting=s3\n"
    (line,) = late_list(log, 0.0, 100.0, buffer_s=0.2)
    assert line == (
        "s1 part 3: 0.63 s late; waited text 1.30 / delivery 0.00 / queue 0.00 /"
        " synthesis 0.20 s; its tokens held 0.40 s"
    )
    assert late_list(log, 0.0, 11.0, buffer_s=0.2) == []
    assert held(log)["s1"] == [(10.5, 10.9), (12.0, 12.5)]


def test_late_list_names_what_the_tts_made_while_a_late_parts_text_was_on_its_way() -> None:
    """s1's join left the LLM at 10.3 and was at the TTS at 10.6, behind s2's later part
    (10.25-10.6); s3's first part ended before the text left, so it is not named."""
    log = (
        "voice-part first s1 start=10.0000 end=10.1000 runs_out=0.0000 text=9.9000"
        " prev=0.0000 audio=0.3700\n"
        "voice-part first s3 start=10.1000 end=10.2500 runs_out=0.0000 text=10.0000"
        " prev=0.0000 audio=0.3700\n"
        "voice-part next s2 start=10.2500 end=10.6000 runs_out=11.0000 text=10.2000"
        " prev=9.0000 audio=1.4000\n"
        "voice-part next s1 start=10.6000 end=10.8500 runs_out=10.4700 text=10.6000"
        " written=10.3000 prev=10.1000 audio=1.0000\n"
    )
    (line,) = late_list(log, 0.0, 100.0, buffer_s=0.2)
    assert line.endswith("its tokens held 0.00 s; the TTS meanwhile: s2 next 0.35")
    assert "delivery 0.30" in line
