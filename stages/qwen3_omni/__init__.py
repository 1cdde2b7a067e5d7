"""Qwen3-Omni as omnitrio stages: thinker -> talker -> code2wav.

Built on transformers' ``Qwen3OmniMoe*`` classes; every stage reads its part of one
checkpoint folder (``tiny.make_tiny_checkpoint`` writes a tiny random-init one,
``tiny.split_checkpoint`` splits a published one). A family's package holds its name
and nothing else: import from its modules (``thinker.py``, ``talker.py``,
``code2wav.py``, ``payloads.py``, ``tiny.py``, ...).
"""

FAMILY = "qwen3-omni"
