"""The systems ``omnitrio bench`` compares omnitrio with, simulated on the same stages:
the vllm-omni model (``_vllm_omni_*.py``: the seeds' vllm-omni and today's, one model
with the settings of each in ``_vllm_omni_settings.py``), the orchestrator shape,
Pipecat and a monolithic generate loop. They load the harness's targets
(``benchmarks.harness``); nothing in the runtime imports them."""
