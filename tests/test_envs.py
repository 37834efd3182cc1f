import doctest
import pickle
import threading
import time
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlkit.envs.calculator
from rlkit.envs import (
    ENVS,
    ToolResult,
    call_tool,
    check_env_args,
    class_tool_schemas,
    env_class,
    env_metrics,
    make_factory,
    tool_schemas,
    tools_of,
)
from rlkit.envs.arguments import MAX_CHARS, ToolArgumentError
from rlkit.envs.calculator import MAX_LENGTH, CalculatorEnv, CalculatorError, evaluate
from rlkit.errors import UserError
from rlkit.recipe import EnvSpec

FAST = 0.5  # seconds: a hostile expression must be refused within this
# Without the length limit, 200,001 characters of `1+1+...` take 0.10-0.20 s to refuse on 2 idle cores and took 0.53 s
# once with a training run beside the suite's two workers; a parser that hung or blew up would take far longer.
UNLIMITED_FAST = 2.0


def timed_calculate(expression, tool=True):
    """(result or the refusal, seconds) of the calculator tool (``tool=False``: of ``evaluate``, past the tool's
    argument check); any other exception propagates and fails the test. The tool's first call in a process builds
    its argument schema with transformers (imported then, 1-3 s), so a call before the clock keeps that out."""
    CalculatorEnv().calculate("0")
    start = time.perf_counter()
    try:
        outcome = CalculatorEnv().calculate(expression) if tool else evaluate(expression)
    except (CalculatorError, ToolArgumentError) as e:  # past MAX_LENGTH, the tool's schema refuses it first
        outcome = e
    return outcome, time.perf_counter() - start


# ---------------------------------------------------------------------------------------------
# The calculator: correct results

CORRECT = [
    ("2 + 3 * 4", "14"),
    ("(2 + 3) * 4", "20"),
    ("2 ** 3 ** 2", "512"),  # right-associative
    ("2^3^2", "512"),
    ("-2 ** 2", "-4"),  # ** binds tighter than unary minus
    ("(-2) ** 2", "4"),
    ("--3", "3"),
    ("+5 - -5", "10"),
    ("7 // 2", "3"),
    ("-7 // 2", "-4"),
    ("7 % 3", "1"),
    ("-7 % 3", "2"),
    ("7 / 2", "3.5"),
    ("10 / 2", "5"),  # an integral float prints without ".0"
    ("1 / 3", "0.333333333333"),
    ("0.1 + 0.2", "0.3"),  # float noise hidden
    ("1.5e3 * 2", "3000"),
    (".5 + .25", "0.75"),
    ("2 ** -1", "0.5"),
    ("2 ** 0.5", "1.41421356237"),
    ("1e-5", "1e-05"),
    ("-0.0", "0"),
    ("0 ** 0", "1"),
    ("  12 *  ( 3+4 )  ", "84"),
    ("(((1 + 2)))", "3"),
    ("1,234 + 1", "1235"),
    ("1,234,567.5 * 2", "2469135"),
    ("6 × 7", "42"),
    ("84 ÷ 2", "42"),
    ("5 − 3", "2"),
    ("99999999999 * 99999999999", "9999999999800000000001"),  # ints stay exact
    ("2 ** 100", "1267650600228229401496703205376"),
    ("10 ** 100", "1" + "0" * 100),  # the largest value allowed
    ("1.0001 ** 3650", "1.44048772076"),  # daily compounding: large exponents are fine when the result is
    ("(1250 + 37.5) * 12 / 100", "154.5"),
    ("+".join(["1"] * 100), "100"),  # a long flat sum is 100 levels deep: allowed
    ("-" * 199 + "1", "-1"),
]


@pytest.mark.parametrize("expression,expected", CORRECT)
def test_calculator_results(expression, expected):
    assert CalculatorEnv().calculate(expression) == expected


def test_calculator_doctests():
    assert doctest.testmod(rlkit.envs.calculator).failed == 0


# ---------------------------------------------------------------------------------------------
# The calculator: hostile input is refused quickly, with a message, and runs nothing

HOSTILE = [
    ("__import__('os').system('touch {sentinel}')", "unsupported syntax: Call"),
    ("open('{sentinel}', 'w').write('x')", "unsupported syntax: Call"),
    ("exec(\"open('{sentinel}', 'w')\")", "unsupported syntax: Call"),
    ("().__class__.__bases__[0].__subclasses__()", "unsupported syntax: Call"),
    ("open('/etc/passwd').read()", "unsupported syntax: Call"),
    ("breakpoint()", "unsupported syntax: Call"),
    ("__builtins__", "unsupported syntax: name '__builtins__'"),
    ("(1).__class__", "unsupported syntax: Attribute"),
    ("lambda: 1", "unsupported syntax: Lambda"),
    ("[1]*10**9", "unsupported syntax: List"),
    ("'a'*10**9", "unsupported syntax: str literal"),
    ("[x for x in range(10**9)]", "unsupported syntax: ListComp"),
    ("{}", "unsupported syntax: Dict"),
    ("9**9**9**9", "number too large"),
    ("9**9**9", "number too large"),
    ("2 ** 2 ** 2 ** 2 ** 2", "number too large"),
    ("10**100000", "number too large"),
    ("10**100 * 10", "number too large"),
    ("9" * 150, "number too large"),
    ("1e309", "number too large"),
    ("1e100 / 1e-300", "number too large"),
    ("2**-100000", "number too small"),
    ("0.5 ** 10**99", "number too small"),
    ("(" * 10_000 + "1" + ")" * 10_000, "expression too long"),
    ("-" * 100_000 + "1", "expression too long"),
    ("1" * 201, "expression too long"),
    ("1/0", "division by zero"),
    ("1%0", "division by zero"),
    ("1//0", "division by zero"),
    ("5.5 % 0", "division by zero"),
    ("0**-1", "division by zero"),
    ("0.0 ** -2", "division by zero"),
    ("(-8) ** 0.5", "no real result"),
    ("1\x00", "invalid"),
    ("f'{1}'", "unsupported syntax: JoinedStr"),
    ("(x := 1)", "unsupported syntax: NamedExpr"),
    ("x", "unsupported syntax: name 'x'"),
    ("True", "unsupported syntax: bool literal"),
    ("None", "unsupported syntax: NoneType literal"),
    ("1j", "unsupported syntax: complex literal"),
    ("'1' + '1'", "unsupported syntax: str literal"),
    ("1 < 2", "unsupported syntax: Compare"),
    ("3 & 1", "unsupported syntax: operator BitAnd"),
    ("~1", "unsupported syntax: operator Invert"),
    ("not 1", "unsupported syntax: operator Not"),
    ("1,2", "unsupported syntax: comma"),
    ("1; 2", "invalid syntax"),
    ("import os", "invalid syntax"),
    ("2 +", "invalid syntax"),
    ("   ", "empty expression"),
]


@pytest.mark.parametrize("expression,message", HOSTILE, ids=[repr(e[:40]) for e, _ in HOSTILE])
def test_calculator_refuses_hostile_input(expression, message, tmp_path):
    sentinel = tmp_path / "injected"
    outcome, seconds = timed_calculate(expression.replace("{sentinel}", str(sentinel)))
    assert isinstance(outcome, CalculatorError | ToolArgumentError)
    assert message in str(outcome)
    assert seconds < FAST
    assert not sentinel.exists()


def test_calculator_refuses_non_strings():
    with pytest.raises(ToolArgumentError, match="^expression must be a string, not an integer$"):
        CalculatorEnv().calculate(42)
    with pytest.raises(CalculatorError, match="must be a string"):
        evaluate(42)  # the evaluator's own check, for Python callers


@pytest.mark.parametrize("expression", [
    "(" * 10_000 + "1" + ")" * 10_000,  # the parser's nesting limit
    "-" * 100_000 + "1",  # the parser's stack
    "1+" * 100_000 + "1",  # RecursionError while building the AST
    "-" * 1_000 + "1",  # parses; the evaluator's depth limit
])
def test_bounds_hold_without_the_length_limit(expression, monkeypatch):
    monkeypatch.setattr(rlkit.envs.calculator, "MAX_LENGTH", 10**6)
    outcome, seconds = timed_calculate(expression, tool=False)
    assert isinstance(outcome, CalculatorError)
    assert seconds < UNLIMITED_FAST


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=250) | st.text(alphabet="0123456789.,+-*/%^()e ×÷", max_size=250))
def test_arbitrary_text_never_crashes_or_hangs(text):
    outcome, seconds = timed_calculate(text)
    assert isinstance(outcome, str | CalculatorError | ToolArgumentError)
    assert seconds < FAST


_NUMBERS = (st.integers(0, 10**40).map(str)
            | st.floats(0, 1e300, allow_nan=False, allow_infinity=False).map(repr)
            | st.sampled_from(["0", "1", "2", "9", "0.5"]))
_OPS = st.sampled_from(["+", "-", "*", "/", "//", "%", "**"])
_ARITHMETIC = st.recursive(
    _NUMBERS,
    lambda inner: st.tuples(inner, _OPS, inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})") | inner.map(lambda e: f"(-{e})"),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_ARITHMETIC)
def test_generated_arithmetic_matches_python(expression):
    start = time.perf_counter()
    try:
        value = evaluate(expression)
    except CalculatorError:
        value = None
    assert time.perf_counter() - start < FAST
    if value is not None:
        # Safe to hand to Python: the calculator only succeeds when every intermediate value is bounded.
        assert value == eval(expression)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(2, 10**6).map(str) | st.sampled_from(["1e300", "0.5", "-9"]), min_size=2, max_size=12))
def test_power_towers_are_refused_quickly(operands):
    outcome, seconds = timed_calculate("**".join(operands))
    assert isinstance(outcome, str | CalculatorError | ToolArgumentError)
    assert seconds < FAST


def test_calculator_metrics_count_calls_and_errors():
    env = CalculatorEnv()
    env.calculate("1 + 1")
    with pytest.raises(CalculatorError):
        env.calculate("1/0")
    assert env_metrics(env) == {"calls": 2.0, "errors": 1.0}
    assert env.reset(question="What is 1 + 1?", answer="2") is None
    assert env_metrics(env) == {"calls": 0.0, "errors": 0.0}


# ---------------------------------------------------------------------------------------------
# The registry


class SleepyEnv:
    """A test environment: a tool that blocks, one that fails, and members that are not tools."""

    def __init__(self, delay: float, label: str = "sleepy") -> None:
        self.label = label
        self.released = threading.Event()
        self.metrics = {"naps": 0}

    def reset(self, **row) -> None:
        self.metrics = {"naps": 0}

    def get_reward(self) -> float:
        return 0.0

    def nap(self, seconds: float) -> str:
        """Block until released or ``seconds`` pass.

        Args:
            seconds: How long to wait at most.
        """
        self.metrics["naps"] += 1
        self.released.wait(seconds)
        return "rested"

    def fail(self) -> str:
        """Always fails."""
        raise RuntimeError("boom")

    def _helper(self) -> None:
        pass


def factory_kwargs(recipe):
    """What rlkit.envs.make_factory adds for SleepyEnv from the rest of the recipe."""
    return dict(recipe.derived)


@pytest.fixture
def sleepy(monkeypatch):
    monkeypatch.setitem(ENVS, "sleepy", SleepyEnv)
    return "sleepy"


def recipe_with(name, args=None, derived=None):
    return SimpleNamespace(env=EnvSpec(name=name, args=args or {}), derived=derived or {},
                           data=SimpleNamespace(task="sft"))


def test_env_class_resolves_and_suggests():
    assert set(ENVS) == {"calculator", "mcp", "retrieval"}
    assert env_class("calculator") is CalculatorEnv
    with pytest.raises(UserError, match=r"unknown environment 'calculater' \(did you mean 'calculator'\?\); valid: calculator, mcp, retrieval$"):
        env_class("calculater")


def test_check_env_args_names_the_key_and_the_valid_ones(sleepy):
    check_env_args("calculator", {})
    with pytest.raises(UserError, match=r"^env.args.precision: environment 'calculator' takes no such argument; valid: none$"):
        check_env_args("calculator", {"precision": 3})
    with pytest.raises(UserError, match=r"^env.args.lable: .* \(did you mean 'label'\?\); valid: delay, label$"):
        check_env_args(sleepy, {"lable": "x"})


def test_make_factory_builds_picklable_factories(sleepy):
    factory = make_factory(recipe_with("calculator"))
    assert isinstance(factory(), CalculatorEnv)
    assert isinstance(pickle.loads(pickle.dumps(factory))(), CalculatorEnv)
    env = make_factory(recipe_with(sleepy, {"label": "x"}, {"delay": 0.5}))()
    assert (env.label, env.metrics) == ("x", {"naps": 0})


def test_make_factory_errors(sleepy):
    with pytest.raises(UserError, match="no tool environment"):
        make_factory(SimpleNamespace(env=None))
    with pytest.raises(UserError, match=r"^env.args.precision: "):
        make_factory(recipe_with("calculator", {"precision": 3}))
    with pytest.raises(UserError, match=r"^env.args.delay: environment 'sleepy' sets it from the rest of the recipe"):
        make_factory(recipe_with(sleepy, {"delay": 1}, {"delay": 0.5}))
    with pytest.raises(UserError, match=r"^env.args: environment 'sleepy': missing a required argument: 'delay'$"):
        make_factory(recipe_with(sleepy))


def test_tools_follow_trls_rule():
    env = CalculatorEnv()
    assert list(tools_of(env)) == ["calculate"]  # not reset, not the metrics attribute
    assert sorted(tools_of(SleepyEnv(0))) == ["fail", "nap"]  # not reset, get_reward, _helper, label


def test_tool_schema_is_what_trl_renders():
    from transformers.utils import get_json_schema

    schema = get_json_schema(CalculatorEnv().calculate)
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "calculate"
    assert "parentheses" in schema["function"]["description"]
    assert schema["function"]["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": 'The arithmetic expression, e.g. "(1,250 + 37.5) * 12 / 100".'}},
        "required": ["expression"],
    }
    assert tool_schemas(CalculatorEnv()) == [schema]
    assert class_tool_schemas(CalculatorEnv) == [schema]


def test_call_tool_success_with_json_or_dict_arguments():
    env = CalculatorEnv()
    result = call_tool(env, "calculate", '{"expression": "6 * 7"}')
    assert result == ToolResult("calculate", {"expression": "6 * 7"}, "42", None, result.seconds)
    assert 0 <= result.seconds < FAST
    assert call_tool(env, "calculate", {"expression": "2^10"}, timeout=5).content == "1024"
    assert env_metrics(env) == {"calls": 2.0, "errors": 0.0}


@pytest.mark.parametrize("name,arguments,error", [
    ("calculate", '{"expression": ', "tool arguments are not valid JSON: Expecting value: line 1 column 16 (char 15)"),
    ("calculate", "[1, 2]", "tool arguments must be a JSON object, got list"),
    ("calc", {"expression": "1"}, "Tool calc not found; available tools: calculate"),
    ("calculate", {"expr": "1"}, "unknown argument 'expr'; calculate takes: expression"),
    ("calculate", "", "missing argument expression; calculate takes: expression"),
    ("calculate", {"expression": "1/0"}, "division by zero"),
])
def test_call_tool_failures_read_like_trl(name, arguments, error):
    result = call_tool(CalculatorEnv(), name, arguments)
    assert result.error == error
    assert result.content == str({"error": error})  # TRL's tool message for a failed call


def test_call_tool_reports_exceptions_under_a_timeout():
    result = call_tool(SleepyEnv(0), "fail", "{}", timeout=5)
    assert result.content == "{'error': 'boom'}"


def test_call_tool_times_out_without_hanging():
    env = SleepyEnv(0)
    start = time.perf_counter()
    result = call_tool(env, "nap", {"seconds": 30}, timeout=0.1)
    elapsed = time.perf_counter() - start
    env.released.set()  # let the abandoned worker thread finish
    assert result.error == "timed out after 0.1s"
    assert result.content == "{'error': 'timed out after 0.1s'}"
    assert 0.1 <= elapsed < 5.0  # not the nap's 30 s (a loaded CI machine needs the margin)
    assert call_tool(SleepyEnv(0), "nap", {"seconds": 0}, timeout=5).content == "rested"


def test_env_metrics_is_a_copy():
    env = CalculatorEnv()
    metrics = env_metrics(env)
    metrics["calls"] = 99
    assert env.metrics["calls"] == 0
    assert env_metrics(object()) == {}


# ---------------------------------------------------------------------------------------------
# Arguments off the tool's schema (issue 49): one line for the model, never a Python internal


MALFORMED = [  # (arguments, the error the model reads, with {arg} the tool's argument and {tool} its name)
    ({"{arg}": 5}, "{arg} must be a string, not an integer"),
    ({"{arg}": None}, "{arg} must be a string, not null"),
    ({"{arg}": ["a", "b"]}, "{arg} must be a string, not an array"),
    ({"{arg}": {"text": "a"}}, "{arg} must be a string, not an object"),
    ({"{arg}": True}, "{arg} must be a string, not a boolean"),
    ({"{arg}": 2.5}, "{arg} must be a string, not a number"),
    ({}, "missing argument {arg}; {tool} takes: {arg}"),
    ({"{arg}": "1", "top_k": 3}, "unknown argument 'top_k'; {tool} takes: {arg}"),
    ({"{arg}": "1" * 100_000}, "{arg} too long (100000 characters, limit {limit})"),
]


@pytest.fixture(scope="module")
def search_env(tmp_path_factory, tiny_model_dir):
    from rlkit.envs.retrieval import RetrievalEnv
    from rlkit.recipe import RetrievalSpec
    from rlkit.retrieval import build_retriever

    spec = RetrievalSpec(synthetic=8, tokenizer=str(tiny_model_dir), cache_dir=str(tmp_path_factory.mktemp("index")))
    return RetrievalEnv(build_retriever(spec, show_progress=False), description="Search the test articles.")


@pytest.mark.parametrize("arguments,error", MALFORMED, ids=[e.split(" ", 2)[1] + str(i) for i, (_, e) in
                                                             enumerate(MALFORMED)])
def test_malformed_tool_calls_are_one_line_the_model_can_read(arguments, error, search_env):
    search_env.reset()
    for env, tool, arg, limit in ((CalculatorEnv(), "calculate", "expression", MAX_LENGTH),
                                  (search_env, "search", "query", MAX_CHARS)):
        sent = {k.replace("{arg}", arg): v for k, v in arguments.items()}
        want = error.format(arg=arg, tool=tool, limit=limit)
        result = call_tool(env, tool, sent)
        assert (result.error, result.content) == (want, str({"error": want}))
        with pytest.raises(ToolArgumentError) as raised:  # what TRL's tool loop catches and shows the model
            getattr(env, tool)(**sent)
        assert str(raised.value) == want
    assert search_env.metrics["searches"] == 0  # nothing malformed reached the index
    assert call_tool(search_env, "search", {"query": "the"}).error is None  # and the tool still serves


def test_a_described_search_keeps_its_schema_and_its_checks(search_env):
    from transformers.utils import get_json_schema

    from rlkit.envs.retrieval import RetrievalEnv

    shown = get_json_schema(search_env.search)["function"]
    assert shown["description"] == "Search the test articles."
    assert shown["parameters"] == get_json_schema(RetrievalEnv.search)["function"]["parameters"]
    assert call_tool(search_env, "search", '{"query": 7}').error == "query must be a string, not an integer"
