"""omnitrio's measurement code, apart from the runtime package.

``harness/`` is ``omnitrio bench`` (load generation, metrics, reports) and
``baselines/`` the simulated systems it compares omnitrio with; the scripts beside
them measure one thing each (``runtime_micro.py``, ``qwen3_omni_gpu.py``, ...), and
``reliability/`` holds the attack, soak and fuzz tools. Everything here uses
omnitrio's public API only (``tests/test_layout.py`` holds that).
"""
