"""The calculator: a tool that evaluates arithmetic safely (numbers, + - * / // % **, parentheses;
no names, no calls, bounded powers and sizes), and the `calculator` environment built on it."""

from __future__ import annotations

import ast
import operator

from rlpost.envs.base import ENVS, EpisodeRow
from rlpost.envs.tools import ToolEnv, tool

OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
MAX_DIGITS = 100  # of any number an expression makes: 10**10**10 is refused, not computed


def evaluate(expression: str) -> int | float:
    """The value of an arithmetic expression; ValueError names what is not allowed."""
    if len(expression) > 1000:
        raise ValueError("expression longer than 1000 characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e

    def value(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) * len(str(abs(int(left)))) > MAX_DIGITS:
                raise ValueError(f"{left} ** {right} is too large")
            out = OPS[type(node.op)](left, right)
            if isinstance(out, int) and len(str(abs(out))) > MAX_DIGITS:
                raise ValueError(f"a result has more than {MAX_DIGITS} digits")
            return out
        raise ValueError(f"{ast.unparse(node)!r} is not allowed (numbers and + - * / // % ** only)")

    try:
        return value(tree.body)
    except ZeroDivisionError as e:
        raise ValueError("division by zero") from e


@tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses)."""
    result = evaluate(expression)
    if isinstance(result, float) and result.is_integer():
        result = int(result)
    return str(result)


@ENVS.register("calculator")
def calculator_env(row: EpisodeRow, options) -> ToolEnv:
    """The model may call `calculator` before it answers; a turn without a call is the answer."""
    return ToolEnv([calculator], options)
