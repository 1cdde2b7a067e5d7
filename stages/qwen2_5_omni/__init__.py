"""Qwen2.5-Omni as omnitrio stages: thinker -> talker -> token2wav (DiT + BigVGAN).

Built on transformers' ``Qwen2_5Omni*`` classes. Each stage loads its own folder
of a checkpoint (``checkpoint/thinker``, ``checkpoint/talker``,
``checkpoint/token2wav``); ``tiny.make_tiny_checkpoint`` writes a tiny random-init one.
A family's package holds its name and nothing else: import from its modules
(``thinker.py``, ``talker.py``, ``token2wav.py``, ``payloads.py``, ``tiny.py``, ...).
"""

FAMILY = "qwen2.5-omni"
