"""The offline voice-chat stages (configs/voice-chat.yaml): Silero VAD, Whisper or
Moonshine ASR, SmolLM2 LLM and Piper TTS. A family's package holds its name and nothing
else: import from its modules (``vad.py``, ``asr.py``, ``llm.py``, ``tts.py``,
``payloads.py``, ...)."""

FAMILY = "voice"
