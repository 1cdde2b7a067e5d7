"""The config loader under fuzzing: any input gives a PipelineConfig or a ConfigError.

``load_config`` / ``parse_config`` take text, bytes and structures from people
and tools. Whatever they are given, they return a validated ``PipelineConfig``
or raise ``ConfigError`` with the message ``SOURCE: KEY: problem`` — never any
other exception. The properties here run with a fixed seed (``derandomize``) so
the suite is deterministic; ``benchmarks/reliability/fuzz.py --target config`` runs the
same strategies with random seeds and many more examples.

Open bugs go in ``KNOWN_BUGS``: the properties tolerate exactly those failures
(so they keep guarding everything else) while a test pins the bug's reproducer.
None is open: the bugs the fuzzing found are fixed and ``test_fixed_bug`` keeps
their reproducers (``REPRODUCERS``) as regression tests.
"""

from __future__ import annotations

import copy
import itertools
import math
import os
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omnitrio import ConfigError, PipelineConfig, load_config, parse_config

SYNTHETIC = "stages.synthetic:SyntheticStage"
SOURCE = "<fuzz>"

# --- the promise ----------------------------------------------------------------------------


def _tricky() -> st.SearchStrategy[object]:
    return st.sampled_from(TRICKY_VALUES).map(copy.deepcopy)  # fresh lists and dicts


def _raised_in_yaml(error: BaseException) -> bool:
    files = [frame.filename for frame in traceback.extract_tb(error.__traceback__)]
    return any(f"{os.sep}yaml{os.sep}" in name for name in files)


# The open bugs: name -> does this exception show it?
KNOWN_BUGS: dict[str, Callable[[BaseException], bool]] = {}
# (bug, a file's bytes that show it, what load_config raises today)
REPRODUCERS: list[tuple[str, bytes, type[Exception]]] = [
    ("file is not UTF-8", "pipeline: {name: caf\xe9}\n".encode("latin-1"), UnicodeDecodeError),
    ("file is not UTF-8", b"\xff\xfe", UnicodeDecodeError),
    ("YAML scalar PyYAML cannot build", b"pipeline: {name: t}\ncreated: 2001-02-30\n", ValueError),
    ("YAML scalar PyYAML cannot build", b"pipeline: !!int x\n", ValueError),
    ("YAML scalar PyYAML cannot build", b"pipeline: !!float\n", IndexError),
    ("YAML scalar PyYAML cannot build", b"pipeline: !!bool x\n", KeyError),
    ("YAML scalar PyYAML cannot build", b"pipeline: !!timestamp x\n", AttributeError),
    ("deep YAML nesting", b"[" * 1000, RecursionError),
]


def _known_bug(error: BaseException) -> str | None:
    return next((name for name, shows in KNOWN_BUGS.items() if shows(error)), None)


def _check_message(error: ConfigError, source: str) -> None:
    lines = []
    for each in (error, *error.also):  # every problem found in the config
        assert each.source == source
        assert isinstance(each.key, str)
        assert each.key
        assert isinstance(each.problem, str)
        assert each.problem
        assert each is error or not each.also  # one level: the first holds the rest
        lines.append(f"{source}: {each.key}: {each.problem}")
    assert str(error) == "\n".join(lines)


def check_outcome(
    call: Callable[[], PipelineConfig],
    source: str,
    on_known_bug: Callable[[str], None] | None = None,
) -> PipelineConfig | None:
    """Run ``call``; assert it returns a sound config or raises a well-formed ConfigError.

    Any other exception propagates (the property fails) unless it is a known bug,
    which is passed to ``on_known_bug`` by name.
    """
    try:
        config = call()
    except ConfigError as error:
        _check_message(error, source)
        return None
    except Exception as error:
        bug = _known_bug(error)
        if bug is None:
            raise
        if on_known_bug is not None:
            on_known_bug(bug)
        return None
    assert isinstance(config, PipelineConfig)
    assert config.source == source
    assert config.stages
    names = [stage.name for stage in config.stages]
    assert len(set(names)) == len(names)
    # Stages come in chain order: each edge goes from one stage to the next.
    links = {(edge.source, edge.target) for edge in config.edges}
    assert links == set(itertools.pairwise(names))
    return config


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "pipeline.yaml"


def load_bytes(path: Path, content: bytes) -> PipelineConfig | None:
    path.write_bytes(content)
    return check_outcome(lambda: load_config(path), str(path))


# --- strategies (benchmarks/reliability/fuzz.py uses them too) ------------------------------

CONFIG_KEYS = [
    "pipeline",
    "stages",
    "edges",
    "name",
    "max_streams",
    "client_capacity",
    "shutdown_timeout_s",
    "step_timeout_s",
    "impl",
    "device",
    "max_batch_size",
    "params",
    "from",
    "to",
    "capacity",
    "source",
    "steps",
    "outputs_per_input",
    "visible",
    "service_time_ms",
]
TRICKY_VALUES: list[object] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**63,
    2**64,
    10**400,
    -(10**400),
    0.0,
    -0.0,
    1e-320,
    math.inf,
    -math.inf,
    math.nan,
    "",
    " ",
    "\x00",
    "\ud800",
    "a",
    "b",
    "a:b",
    ":",
    "os:sep",
    "stages.synthetic:Nope",
    "stages.nowhere:SyntheticStage",
    SYNTHETIC,
    "cuda",
    [],
    {},
    [None],
    {"": None},
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=8)  # YAML !!binary
    | st.dates()  # YAML timestamps
    | _tricky()
)
hashable_keys = (
    st.sampled_from(CONFIG_KEYS)
    | st.text(max_size=8)
    | st.integers()
    | st.booleans()
    | st.none()
    | st.floats(allow_nan=False)
    | st.dates()
)
structures = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(hashable_keys, inner, max_size=4)
        | st.tuples(inner, inner)
        | st.frozensets(st.integers() | st.text(max_size=4), max_size=3)  # YAML !!set
    ),
    max_leaves=24,
)

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_\-]{0,6}", fullmatch=True)
synthetic_params = st.fixed_dictionaries(
    {},
    optional={
        "steps": st.integers(0, 50) | st.none(),
        "outputs_per_input": st.integers(0, 3),
        "visible": st.sampled_from(["text", "audio", "trace"]),
        "service_time_ms": st.floats(0, 5),
        "payload_bytes": st.integers(0, 4096),
    },
)


@st.composite
def valid_configs(draw: st.DrawFn) -> dict[str, Any]:
    """A config dict that must load: a chain of synthetic stages, listed in any order."""
    names = draw(st.lists(identifiers, min_size=1, max_size=4, unique=True))
    pipeline: dict[str, Any] = {"name": draw(st.text(min_size=1, max_size=8))}
    for key, values in (
        ("max_streams", st.integers(1, 512)),
        ("client_capacity", st.integers(1, 64)),
        ("shutdown_timeout_s", st.floats(0.01, 60)),
    ):
        if draw(st.booleans()):
            pipeline[key] = draw(values)
    stages = []
    for name in names:
        stage: dict[str, Any] = {"name": name, "impl": SYNTHETIC}
        if draw(st.booleans()):
            stage["max_batch_size"] = draw(st.integers(1, 64))
        if draw(st.booleans()):
            stage["device"] = draw(st.sampled_from(["cpu", "cuda:0"]))
        if draw(st.booleans()):
            stage["params"] = draw(synthetic_params)
        stages.append(stage)
    edges = []
    for source, target in itertools.pairwise(names):
        edge: dict[str, Any] = {"from": source, "to": target}
        if draw(st.booleans()):
            # at least a step's payloads (outputs_per_input <= 3): below that the
            # config is refused when parsed (a capacity check, tests/runtime/test_errors.py)
            edge["capacity"] = draw(st.integers(3, 32))
        edges.append(edge)
    config: dict[str, Any] = {
        "pipeline": pipeline,
        "stages": draw(st.permutations(stages)),
        "edges": draw(st.permutations(edges)),
    }
    if not edges and draw(st.booleans()):
        config["edges"] = draw(st.sampled_from([None, []]))  # `edges:` left empty
    return config


def _containers(value: object, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of every dict and list inside ``value`` (itself included)."""
    if isinstance(value, dict):
        yield path
        for key, inner in value.items():
            yield from _containers(inner, (*path, key))
    elif isinstance(value, list):
        yield path
        for index, inner in enumerate(value):
            yield from _containers(inner, (*path, index))


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


def _retype(value: object) -> list[object]:
    """The same value in other YAML types."""
    return [str(value), [value], {"value": value}, None, repr(value).encode()]


MUTATIONS = ["tricky", "retype", "rename", "add", "replace", "drop", "duplicate", "clear"]


def _entries(container: dict[Any, Any] | list[Any]) -> list[Any]:
    return list(container) if isinstance(container, dict) else list(range(len(container)))


def mutated(
    base: st.SearchStrategy[dict[str, Any]],
    *,
    key_names: list[str],
    keys: st.SearchStrategy[Any],
    values: st.SearchStrategy[Any],
    tricky: st.SearchStrategy[Any],
) -> st.SearchStrategy[dict[str, Any]]:
    """Values of ``base`` with one to four mutations anywhere inside: keys dropped, renamed
    (to one of ``key_names`` or misspelt) or added, values replaced by ``values``, by
    ``tricky`` ones or by themselves in another type, entries duplicated, containers
    emptied. Deterministic given the draws, so hypothesis can shrink it."""

    @st.composite
    def strategy(draw: st.DrawFn) -> dict[str, Any]:
        value = copy.deepcopy(draw(base))
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(MUTATIONS))
            containers = list(_containers(value))[::-1]  # deepest first, the root last
            # Every entry of every container is equally likely to be hit.
            slots = [(path, k) for path in containers for k in _entries(_at(value, path))]
            if op in ("add", "clear") or not slots:
                container = _at(value, draw(st.sampled_from(containers)))
                if op == "clear":
                    container.clear()
                elif isinstance(container, dict):
                    container[draw(keys)] = draw(values)
                else:
                    container.insert(draw(st.integers(0, len(container))), draw(values))
                continue
            path, key = draw(st.sampled_from(slots))
            container = _at(value, path)
            if op == "drop":
                del container[key]
            elif op == "duplicate" and isinstance(container, list):
                container.insert(key, copy.deepcopy(container[key]))
            elif op == "duplicate":
                container[key] = [container[key], copy.deepcopy(container[key])]
            elif op == "rename" and isinstance(container, dict):
                misspelt = st.builds(lambda k: f"{k}_", st.just(key))
                container[draw(st.sampled_from(key_names) | misspelt)] = container.pop(key)
            elif op == "retype":
                container[key] = draw(st.sampled_from(_retype(container[key])))
            elif op == "tricky":
                container[key] = draw(tricky)
            else:
                container[key] = draw(values)
        return value

    return strategy()


def one_value_replaced(
    base: st.SearchStrategy[dict[str, Any]], values: st.SearchStrategy[Any]
) -> st.SearchStrategy[dict[str, Any]]:
    """Values of ``base`` with exactly one entry, anywhere inside, set to one of ``values``:
    everything else stays valid, so the checks of that one entry are reached."""

    @st.composite
    def strategy(draw: st.DrawFn) -> dict[str, Any]:
        value = copy.deepcopy(draw(base))
        slots = [(path, k) for path in _containers(value) for k in _entries(_at(value, path))]
        path, key = draw(st.sampled_from(slots))
        _at(value, path)[key] = draw(values)
        return value

    return strategy()


def mutated_configs() -> st.SearchStrategy[dict[str, Any]]:
    """A valid config, mutated: almost valid, usually."""
    return mutated(
        valid_configs(),
        key_names=CONFIG_KEYS,
        keys=hashable_keys,
        values=structures,
        tricky=_tricky(),
    ) | one_value_replaced(valid_configs(), _tricky())


YAML_TOKENS = [
    "pipeline:",
    "stages:",
    "edges:",
    " name: t",
    "\n",
    "\n  ",
    "- ",
    "  - ",
    "{",
    "}",
    "[",
    "]",
    ", ",
    ": ",
    "? ",
    "&a ",
    "*a",
    "<<: *a",
    "!!binary ",
    "!!set ",
    "!!python/object:os.system ",
    "!!float ",
    "!!int ",
    "!!str ",
    "2001-02-30",
    "x: 2001-13-01\n",
    "[" * 600,
    "{a: " * 300,
    "2001-12-14t21:59:43.10-05:00",
    ".inf",
    ".nan",
    "~",
    "0x1F",
    "1e400",
    '"\\ud800"',
    '"\\x00"',
    "'",
    '"',
    "#",
    "|",
    ">",
    "%YAML 1.1\n---\n",
    "---\n",
    "...\n",
    "\t",
    "\ufeff",
    f"impl: {SYNTHETIC}",
    "{from: a, to: b}",
]
yaml_texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.sampled_from(YAML_TOKENS) | st.text(max_size=4), max_size=40).map("".join),
    valid_configs().map(lambda c: yaml.safe_dump(c, allow_unicode=True)),
    st.tuples(
        valid_configs().map(lambda c: yaml.safe_dump(c, default_flow_style=False)),
        st.integers(0, 400),
        st.sampled_from(YAML_TOKENS) | st.text(max_size=3),
        st.integers(0, 3),
    ).map(lambda t: t[0][: t[1]] + t[2] + t[0][t[1] + t[3] :]),  # spliced
)
file_bytes = st.one_of(
    st.binary(max_size=200),
    yaml_texts.map(lambda text: text.encode("utf-8", "surrogatepass")),
    st.tuples(yaml_texts, st.sampled_from(["latin-1", "utf-16", "utf-32", "cp1252"])).map(
        lambda t: t[0].encode(t[1], "replace")
    ),
    st.tuples(yaml_texts, st.binary(min_size=1, max_size=4), st.integers(0, 200)).map(
        lambda t: (
            t[0].encode("utf-8", "surrogatepass")[: t[2]]
            + t[1]
            + t[0].encode("utf-8", "surrogatepass")[t[2] :]
        )
    ),
)

FUZZ: dict[str, Any] = {
    "deadline": None,
    "database": None,
    "derandomize": True,  # a fixed seed: the suite is deterministic
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
}

# --- properties -----------------------------------------------------------------------------


@settings(**FUZZ, max_examples=300)
@given(config=valid_configs())
def test_valid_configs_load_in_chain_order(config: dict[str, Any]) -> None:
    loaded = check_outcome(lambda: parse_config(config, source=SOURCE), SOURCE)
    assert loaded is not None


@settings(**FUZZ, max_examples=2000)
@given(config=mutated_configs())
def test_almost_valid_configs_load_or_name_the_key(config: dict[str, Any]) -> None:
    check_outcome(lambda: parse_config(config, source=SOURCE), SOURCE)


@settings(**FUZZ, max_examples=400)
@given(data=structures, source=st.text(max_size=10))
def test_any_structure_loads_or_is_refused(data: object, source: str) -> None:
    check_outcome(lambda: parse_config(data, source=source), source)


@settings(**FUZZ, max_examples=500)
@given(text=yaml_texts)
def test_any_yaml_text_loads_or_is_refused(config_file: Path, text: str) -> None:
    load_bytes(config_file, text.encode("utf-8", "surrogatepass"))


@settings(**FUZZ, max_examples=300)
@given(content=file_bytes)
def test_any_file_bytes_load_or_are_refused(config_file: Path, content: bytes) -> None:
    load_bytes(config_file, content)


def test_yaml_and_in_code_configs_agree(config_file: Path) -> None:
    # The YAML path and the in-code path agree on a valid config.
    config = {
        "pipeline": {"name": "t"},
        "stages": [{"name": "a", "impl": SYNTHETIC}, {"name": "b", "impl": SYNTHETIC}],
        "edges": [{"from": "a", "to": "b"}],
    }
    loaded = load_bytes(config_file, yaml.safe_dump(config).encode())
    assert loaded is not None
    assert loaded.model_copy(update={"source": SOURCE}) == parse_config(config, source=SOURCE)


def test_self_referencing_structures_are_refused() -> None:
    # YAML anchors and aliases build such structures (``pipeline: &a {x: *a}``).
    data: dict[str, Any] = {"pipeline": {"name": "t"}, "stages": []}
    data["stages"].append(data)
    check_outcome(lambda: parse_config(data, source=SOURCE), SOURCE)
    data = {"pipeline": {"name": "t"}, "stages": [{"name": "a", "impl": SYNTHETIC}]}
    data["pipeline"]["name"] = data
    check_outcome(lambda: parse_config(data, source=SOURCE), SOURCE)
    params: dict[str, Any] = {}
    params["steps"] = params
    data = {
        "pipeline": {"name": "t"},
        "stages": [{"name": "a", "impl": SYNTHETIC, "params": params}],
    }
    check_outcome(lambda: parse_config(data, source=SOURCE), SOURCE)


# --- the bugs the fuzzing found, fixed --------------------------------------------------


@pytest.mark.parametrize(
    ("bug", "content"),
    [pytest.param(bug, content, id=f"{bug}: {content[:24]!r}") for bug, content, _ in REPRODUCERS],
)
def test_fixed_bug(tmp_path: Path, bug: str, content: bytes) -> None:
    """Each reproducer the fuzzing found gives a ConfigError now (regression test)."""
    path = tmp_path / "pipeline.yaml"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: "), bug
