"""omnitrio's synthetic stages written on sglang-omni's own scheduler hooks.

Runs inside the peer's virtual environment (``benchmarks/peers/sglang_omni/setup``),
never in omnitrio's: each module here imports sglang-omni, and the stage processes
that sglang-omni's ``MultiProcessPipelineRunner`` spawns import them by name.
"""
