"""``resolved_view`` (stand-in): the engine's resolved settings, read only by the platform
hooks for SGLang engine stages, which the benchmark's synthetic stages are not."""

from types import SimpleNamespace


def resolved_view(server_args: object) -> SimpleNamespace:
    return (
        SimpleNamespace(**vars(server_args))
        if hasattr(server_args, "__dict__")
        else SimpleNamespace()
    )
