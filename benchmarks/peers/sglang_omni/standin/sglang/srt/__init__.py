"""The ``sglang.srt`` names sglang-omni's runtime imports (stand-in)."""
