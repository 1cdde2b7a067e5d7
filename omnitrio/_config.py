"""Pipeline configs: YAML in, typed and validated objects out.

A config names the stages (an importable ``module:Class`` each, with its
parameters), the edges between them and their capacities. Every problem is a
``ConfigError`` naming the file, the key and the fix; unknown keys are errors.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pydantic
import yaml

from ._errors import ConfigError
from ._stage import StageDeclarations, StepLimits

DEFAULT_EDGE_CAPACITY = 8
"""Items one stream may have in flight on one stage-to-stage edge."""
DEFAULT_CLIENT_CAPACITY = 16
"""User-visible items one stream may have waiting for its client."""
DEFAULT_MAX_STREAMS = 64
DEFAULT_MAX_BATCH_SIZE = 32
DEFAULT_STEP_TIMEOUT_S = 60.0


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PipelineSection(_Strict):
    name: str = pydantic.Field(min_length=1)
    max_streams: int = pydantic.Field(default=DEFAULT_MAX_STREAMS, ge=1)
    client_capacity: int = pydantic.Field(default=DEFAULT_CLIENT_CAPACITY, ge=1)
    shutdown_timeout_s: float = pydantic.Field(default=5.0, gt=0, allow_inf_nan=False)
    ray_address: str | None = pydantic.Field(default=None, min_length=1)
    """The Ray cluster that stages with ``placement: ray`` join (``ray start --head``
    prints it). None: a local Ray instance is started with the pipeline and stopped
    with it."""
    scheduling: Literal["deadline", "round_robin"] = "deadline"
    """Which ready streams a full batch takes: the earliest playback deadlines, or the
    least recently stepped (``_scheduler.py``)."""
    client_buffer_s: float = pydantic.Field(default=0.25, ge=0, allow_inf_nan=False)
    """A stream's playback deadline is when its client runs out of audio, less this."""
    first_audio_budget_s: float = pydantic.Field(default=1.0, ge=0, allow_inf_nan=False)
    """Before its first audio, a stream's deadline is its admission plus this."""
    admission: Literal["headroom", "max_streams", "busy", "cpu"] = "headroom"
    """``headroom``: admit a stream only while every stage keeps every admitted stream
    faster than real time by at most ``realtime_margin`` (its learned step-time model;
    the margin each stage keeps, ``omnitrio/admission/_margin.py``), and
    shed the newest (or lowest ``priority``) streams when a stage falls behind;
    ``max_streams`` stays a hard cap. ``max_streams``: the count alone. ``busy``: admit
    a stream only while, with it, every stage stays busy at most ``1 / (1 +
    realtime_margin)`` of the time (its busy fraction lately over its active streams:
    the work it actually has, ``omnitrio/admission/_utilisation.py``); sheds nothing.
    ``cpu``: admit a stream only while, with it, the cores the process may use keep every
    live stream that plays audio ``1 + realtime_margin`` x real time at the CPU seconds a
    second of audio has cost lately, beside the cores the streams that play none take
    (stages that share a few cores, ``omnitrio/admission/_cpu.py``); sheds nothing."""
    realtime_margin: float = pydantic.Field(default=0.05, ge=0, le=10, allow_inf_nan=False)
    """The most margin admission keeps: a stream plays at least ``1 + margin`` x real
    time (audio seconds made per second). Under ``headroom`` a stage keeps all of it
    while judged by its declared cost or where streams reach it in groups, and otherwise
    the step-time error its model has shown lately, at least 2 % (all of it, if that is
    less) and never more (``omnitrio/admission/_margin.py``); shedding keeps as many;
    ``busy`` and ``cpu`` keep all of it."""
    admission_wait_s: float = pydantic.Field(default=0.0, ge=0, le=60, allow_inf_nan=False)
    """How long a request that admission turns away may wait for room instead
    (``omnitrio/admission/_wait.py``): it waits while its retry hint falls within that,
    first in first out, asking again when a round is applied or a stream ends, then is
    admitted or refused with the hint of that moment. 0: refused at once. Under
    ``admission: cpu`` a new stream that plays audio then also waits while another is
    on its way to its first audio (``_guards.py``)."""
    admission_max_waiting: int = pydantic.Field(default=16, ge=1, le=4096)
    """The most requests waiting to be admitted at once; one more is refused at once."""
    admission_max_passes: int = pydantic.Field(default=4, ge=0, le=4096)
    """How many requests that play no audio (a transcription, a text chat) may pass one
    waiting request that plays audio and is held only by ``admission: cpu``'s startup
    hold, before the queue is first in, first out again until that one leaves
    (``omnitrio/admission/_wait.py``). 0: none passes."""
    warmup_streams: int | None = pydantic.Field(default=None, ge=1)
    """Admission by headroom: the most streams admitted before any stage's step-time
    model is ready (a burst at start, ``omnitrio/admission/_guards.py``); None: up to
    ``max_streams``, blind."""


class RayResources(_Strict):
    """What a Ray-placed stage's actor reserves on its node (``docs/scale-out.md``)."""

    num_cpus: float = pydantic.Field(default=0.0, ge=0, allow_inf_nan=False)
    """CPUs reserved: 0 (the default) places the stage beside others, as a thread would."""
    num_gpus: float = pydantic.Field(default=0.0, ge=0, allow_inf_nan=False)
    custom: dict[str, float] = pydantic.Field(default_factory=dict)
    """Custom resources, e.g. ``{node_b: 1}`` to pin the stage to the node started with
    ``ray start --resources '{"node_b": 1}'``."""


class StageSpec(_Strict):
    name: str = pydantic.Field(pattern=r"^[A-Za-z_][A-Za-z0-9_\-]*$")
    impl: str = pydantic.Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    device: str = "cpu"
    max_batch_size: int = pydantic.Field(default=DEFAULT_MAX_BATCH_SIZE, ge=1)
    step_timeout_s: float | None = pydantic.Field(
        default=DEFAULT_STEP_TIMEOUT_S, gt=0, allow_inf_nan=False
    )
    """Watchdog: a round on the worker thread (closes, opens, one step) that takes
    longer marks the stage hung (None: no watchdog)."""
    params: dict[str, Any] = pydantic.Field(default_factory=dict)
    placement: Literal["thread", "ray"] = "thread"
    """Where the stage executes: a thread of this process, or a Ray actor."""
    resources: RayResources | None = None
    """With ``placement: ray``: what its actor reserves (default: nothing)."""


class EdgeSpec(_Strict):
    source: str = pydantic.Field(alias="from")
    target: str = pydantic.Field(alias="to")
    capacity: int = pydantic.Field(default=DEFAULT_EDGE_CAPACITY, ge=1)

    @property
    def name(self) -> str:
        return f"{self.source}->{self.target}"


class PipelineConfig(_Strict):
    """A validated pipeline. ``stages`` is in pipeline order (source first)."""

    pipeline: PipelineSection
    stages: tuple[StageSpec, ...] = pydantic.Field(min_length=1)
    edges: tuple[EdgeSpec, ...] = ()
    side_stage: StageSpec | None = None
    """A stage off the chain, fed by its caller (``Pipeline.open_side_stream``): the
    server runs it on each session's live input audio (a VAD) for the Realtime API's
    turn detection (server_vad)."""
    source: str = "<in-code config>"

    def edge_from(self, stage: str) -> EdgeSpec | None:
        return next((e for e in self.edges if e.source == stage), None)


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and validate a YAML pipeline config. Raises ``ConfigError``."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(source, "<file>", f"cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, "<file>", f"not UTF-8 text (byte {exc.start}); save it as UTF-8"
        ) from None
    except ValueError:  # the OS cannot take the path: a NUL byte in it
        raise ConfigError(source, "<file>", "cannot read it (a NUL byte in the path)") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f"line {where.line + 1}" if where is not None else "<file>"
        raise ConfigError(source, line, f"not valid YAML ({exc}); fix the syntax") from None
    except RecursionError:
        raise ConfigError(source, "<file>", "nested too deeply to read; flatten it") from None
    except Exception as exc:
        # PyYAML's constructors raise plain errors (ValueError, KeyError, IndexError,
        # AttributeError, ...) for tagged scalars they cannot build, e.g. `!!int x`.
        problem = f"a value cannot be read ({type(exc).__name__}: {exc}); fix it"
        raise ConfigError(source, "<file>", problem) from None
    return parse_config(data, source=source)


def parse_config(data: object, *, source: str = "<in-code config>") -> PipelineConfig:
    """Validate an already-parsed config mapping. Raises ``ConfigError`` naming every
    problem found (``ConfigError.also``), not only the first."""
    if not isinstance(data, Mapping):
        raise ConfigError(
            source, "<top>", "a config must be a mapping with pipeline, stages, edges"
        )
    problems: list[ConfigError] = []
    if "source" in data:
        problems.append(ConfigError(source, "source", "unknown key; remove it"))
    if "edges" in data and data["edges"] is None:
        data = {**data, "edges": ()}  # `edges:` left empty in YAML
    try:
        config = PipelineConfig.model_validate({**data, "source": source})
    except pydantic.ValidationError as exc:
        problems += [ConfigError(source, _key(e["loc"]), _problem(e)) for e in exc.errors()]
        # The stage entries that are well formed on their own are checked still.
        for key, entry in _stage_entries(data):
            try:
                spec = StageSpec.model_validate(entry)
            except pydantic.ValidationError:
                continue  # its problems are listed above
            problems += _stage_problems(spec, source, key)
        raise ConfigError.of_all(problems) from None
    problems += _graph_problems(config)
    for index, spec in enumerate(config.stages):
        problems += _stage_problems(spec, source, f"stages[{index}]", config=config)
    if config.side_stage is not None:
        problems += _stage_problems(
            config.side_stage, source, "side_stage", config=config, on_chain=False
        )
    if problems:
        raise ConfigError.of_all(problems)
    return config.model_copy(update={"stages": _chain_order(config)})


def _stage_entries(data: Mapping[Any, Any]) -> list[tuple[str, object]]:
    """The raw stage entries of a config mapping, each with its key."""
    stages = data.get("stages")
    entries: list[tuple[str, object]] = []
    if isinstance(stages, list | tuple):
        entries += [(f"stages[{index}]", entry) for index, entry in enumerate(stages)]
    if data.get("side_stage") is not None:
        entries.append(("side_stage", data["side_stage"]))
    return entries


def _stage_problems(
    spec: StageSpec,
    source: str,
    key: str,
    *,
    config: PipelineConfig | None = None,
    on_chain: bool = True,
) -> list[ConfigError]:
    """What is wrong with one stage entry: its impl, its params, its placement, and
    (given the valid ``config`` around it) its per-step limits against the capacities."""
    problems = _placement_problems(spec, source, key)
    try:
        factory = resolve_impl(spec.impl, source, f"{key}.impl")
    except ConfigError as error:
        return [error, *problems]
    try:
        StageDeclarations.of(factory)
    except TypeError as exc:
        problems.append(ConfigError(source, f"{key}.impl", f"{exc}; fix the stage"))
    params, param_problems = _checked_params(spec, factory, source, key)
    problems = [*param_problems, *problems]
    if param_problems:
        return problems
    try:
        limits = _declared_limits(factory, params, source, key)
    except ConfigError as error:
        return [*problems, error]
    if limits is not None and config is not None:
        payloads = limits.max_payloads_per_step if on_chain else 0  # a side stage's go nowhere
        problems += stage_limit_problems(config, spec.name, payloads, limits.max_visible_per_step)
    return problems


def _key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else str(part))
    return key or "<top>"


def _problem(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key; remove it or fix its spelling"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "tuple_type":
        return "should be a list; fix the value"
    if kind == "finite_number":
        return "should be a finite number; fix the value"
    if kind == "too_short":
        return f"needs at least {error['ctx']['min_length']} entry; add one"
    return f"{error['msg'].lower()}; fix the value"


def _graph_problems(config: PipelineConfig) -> list[ConfigError]:
    problems: list[ConfigError] = []

    def problem(key: str, text: str) -> None:
        problems.append(ConfigError(config.source, key, text))

    names = [s.name for s in config.stages]
    for index, name in enumerate(names):
        if names.index(name) != index:
            problem(f"stages[{index}].name", f"duplicate stage name {name!r}; rename it")
    seen_sources: set[str] = set()
    seen_targets: set[str] = set()
    ends_known = True
    for index, edge in enumerate(config.edges):
        for end, key in ((edge.source, "from"), (edge.target, "to")):
            if end not in names:
                ends_known = False
                problem(
                    f"edges[{index}].{key}",
                    f"no stage named {end!r}; stages are {', '.join(names)}",
                )
        if edge.source in seen_sources:
            problem(
                f"edges[{index}].from",
                f"stage {edge.source!r} already has an outgoing edge; pipelines are chains, "
                "so give each stage at most one",
            )
        if edge.target in seen_targets:
            problem(
                f"edges[{index}].to",
                f"stage {edge.target!r} already has an incoming edge; pipelines are chains, "
                "so give each stage at most one",
            )
        seen_sources.add(edge.source)
        seen_targets.add(edge.target)
    if not ends_known:
        return problems  # the chain's shape follows once every edge names a stage
    heads = [n for n in names if n not in seen_targets]
    if not heads:
        problem("edges", "the edges form a cycle; remove the edge into the first stage")
    elif len(heads) > 1:
        loose = heads[1]
        previous = names[names.index(loose) - 1]
        problem(
            "edges",
            f"stage {loose!r} is not on the chain from the first stage; "
            f"add an edge {{from: {previous}, to: {loose}}}",
        )
    return problems


def _chain_order(config: PipelineConfig) -> tuple[StageSpec, ...]:
    by_name = {s.name: s for s in config.stages}
    targets = {e.target for e in config.edges}
    current: str | None = next(n for n in by_name if n not in targets)
    ordered: list[StageSpec] = []
    while current is not None and len(ordered) <= len(by_name):
        ordered.append(by_name[current])
        edge = config.edge_from(current)
        current = edge.target if edge is not None else None
    if len(ordered) != len(by_name):
        missing = next(n for n in by_name if n not in {s.name for s in ordered})
        raise ConfigError(
            config.source,
            "edges",
            f"stage {missing!r} is not on the chain from {ordered[0].name!r}; "
            "connect it with an edge and remove any cycle",
        )
    return tuple(ordered)


def _checked_params(
    spec: StageSpec, factory: Any, source: str, key: str
) -> tuple[dict[str, Any] | None, list[ConfigError]]:
    """The stage's params with its constructor's defaults filled in (None if the
    constructor cannot be introspected), and the problems with them: unknown ones,
    missing ones."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None, []  # not introspectable: the stage checks its own parameters when it loads
    problems: list[ConfigError] = []

    def problem(param: str, text: str) -> None:
        problems.append(ConfigError(source, f"{key}.params.{param}", text))

    parameters = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    known = [n for n in parameters if n not in ("name", "device")]
    for param in spec.params:
        if param in ("name", "device"):
            problem(param, f"{param!r} is set by the stage entry itself; move it out of params")
        elif not takes_any and param not in parameters:
            problem(
                param,
                f"{spec.impl} has no parameter {param!r}; known parameters: "
                + (", ".join(known) or "none"),
            )
    for pname, parameter in parameters.items():
        required = parameter.default is inspect.Parameter.empty and parameter.kind in (
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
            inspect.Parameter.KEYWORD_ONLY,
        )
        if required and pname not in ("name", "device") and pname not in spec.params:
            problem(pname, f"{spec.impl} requires parameter {pname!r}; add it under params")
    return _with_defaults(spec, parameters), problems


def _with_defaults(spec: StageSpec, parameters: Mapping[str, inspect.Parameter]) -> dict[str, Any]:
    """``spec.params`` over its constructor's defaults (``name`` and ``device`` aside)."""
    defaults = {
        n: p.default
        for n, p in parameters.items()
        if p.default is not inspect.Parameter.empty and n not in ("name", "device")
    }
    return {**defaults, **spec.params}


def stage_params(spec: StageSpec, factory: Any) -> dict[str, Any]:
    """The stage's params with its constructor's defaults filled in (as given where the
    constructor cannot be introspected): what its class's declarations are asked for."""
    try:
        return _with_defaults(spec, inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        return dict(spec.params)


def _declared_limits(
    factory: Any, params: Mapping[str, Any] | None, source: str, key: str
) -> StepLimits | None:
    """What a stage class declares one step emits (``Stage``'s docstring): its
    ``step_limits(params)``, else int class attributes, else None (known once it
    loads; ``step_limits`` may say so too, as a wrapper of an undeclared stage does).
    Raises ``ConfigError`` naming the stage's params if ``step_limits`` refuses them."""
    step_limits = getattr(factory, "step_limits", None)
    if callable(step_limits):
        if params is None:
            return None
        try:
            limits = step_limits(params)
        except Exception as exc:
            raise ConfigError(
                source, f"{key}.params", f"{type(exc).__name__}: {exc}; fix the value"
            ) from None
        if limits is not None and not isinstance(limits, StepLimits):
            raise ConfigError(
                source,
                f"{key}.impl",
                f"step_limits returned a {type(limits).__name__}, not a StepLimits or None; "
                "fix the stage",
            )
        return limits
    return StepLimits.of_attributes(factory)


def _placement_problems(spec: StageSpec, source: str, key: str) -> list[ConfigError]:
    if spec.placement == "thread" and spec.resources is not None:
        problem = "resources apply to placement: ray only; set placement: ray or remove them"
        return [ConfigError(source, f"{key}.resources", problem)]
    if spec.placement == "ray" and importlib.util.find_spec("ray") is None:
        problem = (
            "ray is not installed; install the ray extra (pip install 'omnitrio[ray]') "
            "or use placement: thread"
        )
        return [ConfigError(source, f"{key}.placement", problem)]
    return []


def uses_ray(config: PipelineConfig) -> bool:
    """True if any stage (the side stage included) has ``placement: ray``."""
    side = (config.side_stage,) if config.side_stage is not None else ()
    return any(spec.placement == "ray" for spec in (*config.stages, *side))


def resolve_impl(impl: str, source: str, key: str) -> Any:
    """Import ``package.module:Name`` and return the attribute. Raises ``ConfigError``."""
    module_name, _, attr = impl.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            source, key, f"cannot import {module_name!r} ({exc}); install it or fix the module path"
        ) from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ConfigError(
            source, key, f"module {module_name!r} has no {attr!r}; fix the name after the colon"
        ) from None


def check_stage_limits(
    config: PipelineConfig, stage: str, max_payloads_per_step: int, max_visible_per_step: int
) -> None:
    """The config's capacities against a stage's per-step promises: every step's output
    must fit its channels. Called when the config is parsed for the limits a stage
    class declares (``_declared_limits``), and by ``open_pipeline`` as each stage loads
    for the loaded object's own (they may follow its parameters), before any stream
    runs. Raises ``ConfigError`` naming the stage and the key to raise."""
    problems = stage_limit_problems(config, stage, max_payloads_per_step, max_visible_per_step)
    if problems:
        raise ConfigError.of_all(problems)


def stage_limit_problems(
    config: PipelineConfig, stage: str, max_payloads_per_step: int, max_visible_per_step: int
) -> list[ConfigError]:
    """What ``check_stage_limits`` raises, as a list (empty: the capacities fit)."""
    problems: list[ConfigError] = []
    edge = config.edge_from(stage)
    if edge is not None and max_payloads_per_step > edge.capacity:
        problems.append(
            ConfigError(
                config.source,
                f"edges[from={stage}].capacity",
                f"{edge.capacity} is below stage {stage!r} max_payloads_per_step="
                f"{max_payloads_per_step}; raise the capacity",
            )
        )
    if max_visible_per_step > config.pipeline.client_capacity:
        problems.append(
            ConfigError(
                config.source,
                "pipeline.client_capacity",
                f"{config.pipeline.client_capacity} is below stage {stage!r} "
                f"max_visible_per_step={max_visible_per_step}; raise it",
            )
        )
    return problems
