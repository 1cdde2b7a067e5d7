"""A stand-in for the names of the SGLang engine package that sglang-omni's pipeline
runtime imports (platform detection and two helpers). No engine code: the benchmark's
stages are synthetic, so nothing here runs a model. Installed into the peer's own
virtual environment only, never on omnitrio's import path."""

STANDIN = True
__version__ = "0.0.0+omnitrio-standin"
