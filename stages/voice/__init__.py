"""The offline voice-chat stages (configs/voice-chat.yaml): Silero VAD, Whisper ASR,
SmolLM2 LLM and Piper TTS, and what they share."""
