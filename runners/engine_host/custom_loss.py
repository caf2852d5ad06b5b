"""Server-side custom losses (`ServiceClient.create_custom_loss` where the server runs them):
the SDK traces the loss with torch.fx and sends its graph as plain data (nodes, their targets
by name, encoded arguments); nothing in it runs until it is rebuilt here from a list of allowed
operations: torch and math functions that compute on tensors, Python's operators, and tensor
methods that do not leave torch. Anything else is refused when the loss is created, naming it.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from tinker import types

# What a custom loss may call, by the name the SDK sends (torch.fx's qualified names).
_TORCH = (
    "abs exp expm1 log log1p log2 sqrt rsqrt square pow sigmoid tanh relu sign neg "
    "clamp clip clamp_min clamp_max minimum maximum where sum mean min max amax amin "
    "logsumexp softmax log_softmax cumsum prod std var stack cat ones_like zeros_like "
    "full_like isfinite isnan nan_to_num exp2 reciprocal mul add sub div true_divide "
    "lt le gt ge eq ne logical_and logical_or logical_not gather masked_fill"
).split()
_FUNCTIONAL = "logsigmoid softplus relu silu gelu softmax log_softmax".split()
_MATH = "exp log sqrt log1p expm1 tanh".split()
_OPERATORS = (
    "add sub mul truediv floordiv mod pow neg pos abs lt le gt ge eq ne getitem and_ or_ invert xor"
).split()
FUNCTIONS: dict[str, Callable[..., Any]] = {
    **{f"torch.{name}": getattr(torch, name) for name in _TORCH},
    **{f"torch.nn.functional.{name}": getattr(torch.nn.functional, name) for name in _FUNCTIONAL},
    **{f"math.{name}": getattr(math, name) for name in _MATH},
    **{f"operator.{name}": getattr(operator, name) for name in _OPERATORS},
}
METHODS = frozenset(
    (
        "abs exp log log1p sqrt square pow sigmoid tanh relu neg clamp clip clamp_min clamp_max "
        "sum mean min max amax amin logsumexp softmax log_softmax cumsum prod std var float "
        "double detach size dim numel unsqueeze squeeze view reshape flatten expand expand_as "
        "masked_fill where gather sign isfinite isnan nan_to_num mul add sub div lt le gt ge "
        "eq ne logical_and logical_or logical_not"
    ).split()
)
ATTRIBUTES = frozenset({"shape", "ndim", "dtype", "T"})  # builtins.getattr on a tensor
DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "bool": torch.bool,
}
Loss = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


class GraphRefused(ValueError):
    """A graph that asks for something not allowed here; the message names it."""


@dataclass(frozen=True)
class CustomLoss:
    """A created loss: its name, the loss_fn_inputs it reads with their ranks, and the rebuilt
    function (logprobs first, then those inputs; it returns the loss and its metrics)."""

    name: str
    inputs: list[tuple[str, int]]  # after logprobs
    run: Loss


def build(name: str, inputs: Sequence[Mapping[str, Any]], graph: Mapping[str, Any]) -> CustomLoss:
    """The loss `graph` describes, every node checked first (GraphRefused naming the first
    that is not allowed)."""
    declared, nodes = _checked(name, inputs, graph)

    def run(*values: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        env: dict[str, Any] = {}
        for node in nodes:
            op, key = node["op"], node["name"]
            if op == "placeholder":
                env[key] = values[len(env)]
                continue
            args = [_decode(a, env) for a in node.get("args", [])]
            kwargs = {k: _decode(v, env) for k, v in (node.get("kwargs") or {}).items()}
            if op == "output":
                loss, metrics = args[0]
                return loss, dict(metrics)
            if op == "call_method":
                env[key] = getattr(args[0], node["target"])(*args[1:], **kwargs)
            elif node["target"] == "builtins.getattr":
                env[key] = getattr(args[0], args[1])
            else:
                env[key] = FUNCTIONS[node["target"]](*args, **kwargs)
        raise GraphRefused("graph: it ends without an output node")

    return CustomLoss(name, declared[1:], run)


def _checked(
    name: str, inputs: Sequence[Mapping[str, Any]], graph: Mapping[str, Any]
) -> tuple[list[tuple[str, int]], list[Any]]:
    """The inputs declared (name, rank) and the graph's nodes, once every one is allowed."""
    if graph.get("format") != 1:
        raise GraphRefused(f"graph.format: {graph.get('format')!r}; this server reads format 1")
    declared = [(str(i["name"]), int(i["rank"])) for i in inputs]
    if not declared or declared[0] != ("logprobs", 1):
        raise GraphRefused(
            "inputs: the first is logprobs, of rank 1 here (the local engine trains one target "
            "token per position, so logprobs are [T])"
        )
    nodes = list(graph.get("nodes") or [])
    placeholders = [n for n in nodes if n.get("op") == "placeholder"]
    if [p.get("target") for p in placeholders] != [n for n, _ in declared]:
        raise GraphRefused("graph: its placeholders are not the inputs declared, in order")
    for node in nodes:
        _check(name, node)
    if not nodes or nodes[-1].get("op") != "output":
        raise GraphRefused("graph: it ends without an output node")
    return declared, nodes


def _check(name: str, node: Mapping[str, Any]) -> None:
    op, target = node.get("op"), str(node.get("target"))
    where = f"create_custom_loss: {name} node {str(node.get('name'))[:60]!r}"
    if op == "call_function":
        if target == "builtins.getattr":
            attribute = (node.get("args") or [None, None])[1]
            if attribute not in ATTRIBUTES:
                raise GraphRefused(f"{where} reads attribute {attribute!r}, which is not allowed")
        elif target not in FUNCTIONS:
            raise GraphRefused(
                f"{where} calls {target[:80]!r}, which is not among the functions this server "
                "runs (torch and math functions on tensors, Python's operators)"
            )
    elif op == "call_method":
        if target not in METHODS:
            raise GraphRefused(f"{where} calls method {target[:80]!r}, which is not allowed")
    elif op not in ("placeholder", "output"):
        raise GraphRefused(f"{where} is a {op!r} node; only functions and methods may run")


def _decode(value: Any, env: Mapping[str, Any]) -> Any:
    """An argument as the SDK encodes it (custom_loss_graph.CustomLossNode.args)."""
    if isinstance(value, list):
        return [_decode(v, env) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) != 1:
        raise GraphRefused(f"graph: an argument {str(value)[:80]} is not one encoded value")
    ((kind, inner),) = value.items()
    if kind == "ref":
        return env[inner]
    if kind == "tuple":
        return tuple(_decode(v, env) for v in inner)
    if kind == "dict":
        return {k: _decode(v, env) for k, v in inner.items()}
    if kind == "slice":
        return slice(*(_decode(v, env) for v in inner))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float":
        return float(inner)
    if kind == "dtype" and inner in DTYPES:
        return DTYPES[inner]
    raise GraphRefused(f"graph: an argument of kind {kind!r} ({str(inner)[:40]}) is not allowed")


def per_batch(
    loss: CustomLoss, data: list[types.Datum]
) -> Callable[[list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]:
    """The loss over a batch: summed over its datums, each given its target logprobs and the
    inputs the loss reads; metrics summed (`:sum`) or averaged (`:mean`) as the SDK does."""
    for i, datum in enumerate(data):
        for key, rank in loss.inputs:
            tensor = datum.loss_fn_inputs.get(key)
            if tensor is None:
                raise ValueError(
                    f"data[{i}] has no loss_fn_inputs[{key!r}], which {loss.name} takes"
                )
            if len(tensor.shape or [0]) != rank:
                raise ValueError(
                    f"data[{i}].loss_fn_inputs[{key!r}] has rank {len(tensor.shape or [0])}; "
                    f"{loss.name} declared it rank {rank}"
                )

    def run(logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        total: torch.Tensor | None = None
        sums: dict[str, float] = {}
        for datum, lp in zip(data, logprobs, strict=True):
            inputs = [
                torch.as_tensor(datum.loss_fn_inputs[k].to_numpy()).to(lp.device)
                for k, _ in loss.inputs
            ]
            value, metrics = loss.run(lp, *inputs)
            if value.ndim != 0:
                raise ValueError(f"{loss.name} must return a scalar loss, got {tuple(value.shape)}")
            total = value if total is None else total + value
            for key, metric in metrics.items():
                sums[key] = sums.get(key, 0.0) + float(metric.detach())
        assert total is not None
        out = {k: v / len(data) if k.endswith(":mean") else v for k, v in sums.items()}
        return total, out

    return run
