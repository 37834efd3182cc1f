"""A calculator tool: arithmetic on number literals, evaluated by walking ``ast`` against an allow-list.

The model calls ``calculate("(3 + 4) * 12 / 5")`` and reads back ``"16.8"``. Nothing reaches ``eval``:
the text is parsed with ``ast.parse`` and only number literals, ``+ - * / // % **``, unary ``-``/``+``
and parentheses are evaluated. Anything else raises :class:`CalculatorError`, whose message goes back
to the model as the tool result (TRL turns a tool exception into ``{'error': ...}``).

Model-isms accepted: ``^`` means power (a model writing ``2^10`` wants 1024, never XOR); ``×``, ``÷``
and ``−`` (U+2212) mean ``*``, ``/`` and ``-``; commas between groups of three digits are thousands
separators (``1,234,567``). Any other comma is an error: tuples are not arithmetic.

Bounds, so hostile text cannot hang the trainer or exhaust memory: at most ``MAX_LENGTH`` characters
(which bounds the node count and the nesting), and every value within ``±10**MAX_DIGITS``. A power
is checked with logarithms before it runs, so ``9**9**9`` is refused without being computed, and it
must also stay above ``10**-MAX_DIGITS`` (``2**-100000`` would silently underflow to 0). Since every
operand is bounded, every other operation is cheap.
"""

import ast
import math
import operator
import re

from rlkit.envs.arguments import validated

MAX_LENGTH = 200
# The evaluator recurses once per level. No expression within MAX_LENGTH nests deeper (a flat sum of
# 100 terms is 100 levels), so this only guards against a raised MAX_LENGTH.
MAX_DEPTH = 200
MAX_DIGITS = 100

_MODEL_ISMS = str.maketrans({"^": "**", "×": "*", "÷": "/", "−": "-"})
# Groups of exactly three digits after the first comma, not glued to a word or a decimal point.
_THOUSANDS = re.compile(r"(?<![\w.])\d{1,3}(?:,\d{3})+(?!\d)")


class CalculatorError(ValueError):
    """An expression the calculator refuses; the message tells the model what to change."""


def _power(base: int | float, exponent: int | float) -> int | float | complex:
    if abs(base) not in (0, 1):  # 0 and ±1 stay in range whatever the exponent
        size = exponent * math.log10(abs(base))  # log10 of the result's magnitude
        if size > MAX_DIGITS:
            raise CalculatorError(f"number too large (limit 1e{MAX_DIGITS})")
        if size < -MAX_DIGITS:
            raise CalculatorError(f"number too small (limit 1e-{MAX_DIGITS})")
    return base**exponent


_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: _power,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; raises :class:`CalculatorError` for anything else.

    >>> [evaluate(e) for e in ("2 + 3 * 4", "2^10", "7 // 2", "1,234 × 2", "-(1.5 + 0.5)")]
    [14, 1024, 3, 2468, -2.0]
    """
    if not isinstance(expression, str):
        raise CalculatorError('expression must be a string, e.g. "2 * (3 + 4)"')
    if len(expression) > MAX_LENGTH:
        raise CalculatorError(f"expression too long ({len(expression)} characters, limit {MAX_LENGTH})")
    text = _THOUSANDS.sub(lambda m: m.group().replace(",", ""), expression.translate(_MODEL_ISMS)).strip()
    if not text:
        raise CalculatorError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"invalid syntax: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError):  # null bytes; nesting too deep for the parser
        raise CalculatorError("invalid expression") from None
    return _evaluate(tree.body, depth=0)


def _evaluate(node: ast.AST, depth: int) -> int | float:
    if depth > MAX_DEPTH:
        raise CalculatorError(f"expression nested too deeply (limit {MAX_DEPTH} levels)")
    # `type(...) in` rather than isinstance: bool is an int subclass, and True is not a number here.
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left, depth + 1), _evaluate(node.right, depth + 1)
        try:
            value = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise CalculatorError("division by zero") from None
    elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        value = _UNARY[type(node.op)](_evaluate(node.operand, depth + 1))
    else:
        raise CalculatorError(f"unsupported syntax: {_describe(node)}; use numbers, + - * / // % ** and parentheses")
    if isinstance(value, complex):
        raise CalculatorError("no real result (fractional power of a negative number)")
    if not abs(value) <= 10**MAX_DIGITS:  # written this way round so that nan fails too
        raise CalculatorError(f"number too large (limit 1e{MAX_DIGITS})")
    return value


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Constant):
        return f"{type(node.value).__name__} literal"
    if isinstance(node, ast.Tuple):
        return "comma (commas only separate thousands, as in 1,234)"
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return f"operator {type(node.op).__name__}"
    return type(node).__name__


def format_number(value: int | float) -> str:
    """The text the model reads: ints exactly, floats to 12 significant digits (hiding float noise).

    >>> [format_number(v) for v in (42, 4.0, 1 / 3, 0.1 + 0.2, -0.0, 1e20)]
    ['42', '4', '0.333333333333', '0.3', '0', '1e+20']
    """
    if isinstance(value, int):
        return str(value)
    return f"{value + 0.0:.12g}"  # + 0.0 turns -0.0 into 0.0


class CalculatorEnv:
    """One calculator per rollout (TRL's ``environment_factory`` contract); its one tool is ``calculate``.

    ``metrics`` counts the episode's ``calls`` and ``errors`` (refused expressions).
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self, **row) -> None:
        self.metrics: dict[str, float] = {"calls": 0.0, "errors": 0.0}

    @validated(max_chars=MAX_LENGTH)
    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression: numbers, + - * / // % ** (or ^) and parentheses.

        No variables or functions; write a square root as ** 0.5.

        Args:
            expression: The arithmetic expression, e.g. "(1,250 + 37.5) * 12 / 100".

        Returns:
            The result as a number.
        """
        self.metrics["calls"] += 1
        try:
            return format_number(evaluate(expression))
        except CalculatorError:
            self.metrics["errors"] += 1
            raise
