"""The Tinker SDK 0.38 protobuf bodies, with the SDK's own generated classes: a
ForwardBackwardRequest in, a ForwardBackwardOutput and a SampleResponse out.

A body that breaks the wire format raises WireError naming the field (the server answers 400);
one that is well formed but asks for what a text model here cannot do (an image chunk) raises
Unsupported (a failed future, category user).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# google.protobuf ships no type stubs; the generated tinker_public_pb2 has its own .pyi.
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

_DTYPES: dict[int, tuple[str, type[np.generic]]] = {
    pb.DTYPE_FLOAT32: ("float32", np.float32),
    pb.DTYPE_INT64: ("int64", np.int64),
    pb.DTYPE_INT32: ("int64", np.int32),  # the public wire widens int32 to int64
}
_OUT_DTYPES = {"float32": pb.DTYPE_FLOAT32, "int64": pb.DTYPE_INT64}
Span = types.PromptProvenanceSpan | types.SampledProvenanceSpan
_STOP_REASONS = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}


class WireError(ValueError):
    """A body that does not follow the wire format; the message names the field."""


class Unsupported(ValueError):
    """A well-formed request for something the local engine does not do."""


@dataclass(frozen=True)
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    data: list[types.Datum]

    @property
    def tokens(self) -> int:
        return sum(d.model_input.length for d in self.data)

    def sequence_ids(self) -> set[str]:
        """Every recorded sequence its datums' provenance names."""
        return {
            span.sequence_id
            for datum in self.data
            for spans in (datum.model_input_spans, datum.loss_fn_input_spans)
            for span in spans or ()
        }


def decode_forward_backward(body: bytes) -> ForwardBackward:
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except DecodeError as exc:
        raise WireError(
            f"body: not a tinker ForwardBackwardRequest protobuf ({exc}); send it with the "
            "tinker SDK (0.38) or its proto module"
        ) from None
    if not msg.model_id:
        raise WireError("model_id: missing; name the model create_model returned")
    config: dict[str, float | str] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for key, value in msg.loss_fn_config_v2.items():  # v2 wins, as on the hosted service
        config[key] = value.text if value.WhichOneof("value") == "text" else float(value.number)
    data = [_datum(datum, f"data[{i}]") for i, datum in enumerate(msg.data)]
    return ForwardBackward(msg.model_id, msg.seq_id, msg.loss_fn, config, msg.forward_only, data)


def _datum(datum: pb.Datum, where: str) -> types.Datum:
    tokens: list[int] = []
    for j, chunk in enumerate(datum.model_input):
        kind = chunk.WhichOneof("chunk")
        if kind != "encoded_text":
            raise Unsupported(
                f"{where}.model_input[{j}] is an {kind} chunk: the local engine serves text "
                "models (encoded_text chunks) only"
            )
        raw = chunk.encoded_text.tokens
        if len(raw) % 4:
            raise WireError(f"{where}.model_input[{j}].tokens: {len(raw)} bytes is not int32s")
        tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
    inputs = {
        key: _tensor(tensor, f"{where}.loss_fn_inputs[{key!r}]")
        for key, tensor in datum.loss_fn_inputs.items()
    }
    model_input = types.ModelInput.from_ints(tokens)
    if not datum.model_input_spans and not datum.loss_fn_input_spans:
        return types.Datum(model_input=model_input, loss_fn_inputs=inputs)
    # Provenance (Datum.with_provenance): read against the recorded sequences when trained.
    return types.Datum(
        model_input=model_input,
        loss_fn_inputs=inputs,
        model_input_spans=_spans(datum.model_input_spans, f"{where}.model_input_spans"),
        loss_fn_input_spans=_spans(datum.loss_fn_input_spans, f"{where}.loss_fn_input_spans"),
    )


def _spans(spans: Iterable[pb.ProvenanceSpan], where: str) -> list[Span]:
    out: list[Span] = []
    for j, span in enumerate(spans):
        kind = span.WhichOneof("span")
        if kind is None:
            raise WireError(f"{where}[{j}]: neither prompt_tokens nor sampled_tokens")
        arm = getattr(span, kind)
        make = (
            types.PromptProvenanceSpan if kind == "prompt_tokens" else types.SampledProvenanceSpan
        )
        try:
            out.append(make(sequence_id=arm.sequence_id, offset=arm.offset, length=arm.length))
        except ValueError as exc:
            raise WireError(f"{where}[{j}]: {exc}") from None
    return out


def _tensor(tensor: pb.Tensor, where: str) -> types.TensorData:
    if tensor.dtype not in _DTYPES:
        raise WireError(f"{where}.dtype: {tensor.dtype} is not float32, int64 or int32")
    dtype, np_dtype = _DTYPES[tensor.dtype]
    shape = [int(n) for n in tensor.shape]
    if tensor.HasField("sparse_csr"):
        csr = tensor.sparse_csr
        values = _array(csr.values, np_dtype, f"{where}.sparse_csr.values")
        crow = _array(csr.crow_indices, np.int64, f"{where}.sparse_csr.crow_indices")
        col = _array(csr.col_indices, np.int64, f"{where}.sparse_csr.col_indices")
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise WireError(f"{where}.sparse_csr: indices do not fit shape {shape}")
        return types.TensorData(
            data=values.astype(np.dtype(dtype)),
            dtype=dtype,  # type: ignore[arg-type]
            shape=shape,
            sparse_crow_indices=crow.tolist(),
            sparse_col_indices=col.tolist(),
        )
    values = _array(tensor.dense, np_dtype, f"{where}.dense")
    if not shape:
        shape = [int(values.size)]
    if math.prod(shape) != values.size:
        raise WireError(f"{where}.shape: {shape} does not hold its {values.size} values")
    return types.TensorData(
        data=values.astype(np.dtype(dtype)).reshape(shape),
        dtype=dtype,  # type: ignore[arg-type]
        shape=shape,
    )


def _array(raw: bytes, np_dtype: type[np.generic], where: str) -> np.ndarray:
    size = np.dtype(np_dtype).itemsize
    if len(raw) % size:
        raise WireError(f"{where}: {len(raw)} bytes is not a whole number of {size}-byte values")
    return np.frombuffer(raw, dtype=np_dtype)


# Answers ---------------------------------------------------------------------------------


def encode_forward_backward(output: types.ForwardBackwardOutput) -> bytes:
    """One ArrayRecord for the whole call: each field's per-datum arrays back to back, with
    the byte offset where each datum's slice starts (and the end)."""
    out = pb.ForwardBackwardOutput()
    out.loss_fn_output_type = output.loss_fn_output_type or "ArrayRecord"
    for key, value in output.metrics.items():
        out.metrics[key] = float(value)
    if output.loss_fn_outputs:
        record = out.loss_fn_outputs.add()
        record.num_datums = len(output.loss_fn_outputs)
        for name in output.loss_fn_outputs[0]:
            arrays = [datum[name] for datum in output.loss_fn_outputs]
            dtype = arrays[0].dtype
            np_dtype = np.float32 if dtype == "float32" else np.int64
            flat = [np.asarray(a.to_numpy(), dtype=np_dtype).reshape(-1) for a in arrays]
            field = record.fields[name]
            field.dtype = _OUT_DTYPES[dtype]
            field.data = b"".join(a.tobytes() for a in flat)
            field.offsets = np.cumsum([0] + [a.nbytes for a in flat], dtype=np.int64).tobytes()
    return out.SerializeToString()


def encode_sample(response: types.SampleResponse) -> bytes:
    out = pb.SampleResponse()
    for sequence in response.sequences:
        seq = out.sequences.add()
        seq.stop_reason = _STOP_REASONS[sequence.stop_reason]
        tokens = sequence.tokens_np if sequence.tokens_np is not None else sequence.tokens
        seq.tokens = np.asarray(tokens, dtype=np.int32).tobytes()
        logprobs = sequence.logprobs_np if sequence.logprobs_np is not None else sequence.logprobs
        if logprobs is not None:
            seq.logprobs = np.asarray(logprobs, dtype=np.float32).tobytes()
    prompt = response.prompt_logprobs_np
    if prompt is None and response.prompt_logprobs is not None:
        prompt = np.asarray([math.nan if v is None else v for v in response.prompt_logprobs])
    if prompt is not None:
        # NaN is how the wire says "no logprob" (the first position, or those left out).
        out.prompt_logprobs = np.asarray(prompt, dtype=np.float32).tobytes()
    topk = response.topk_prompt_logprobs_np
    if topk is not None:
        out.topk_prompt_logprobs.length, out.topk_prompt_logprobs.k = topk.token_ids.shape
        out.topk_prompt_logprobs.token_ids = np.asarray(topk.token_ids, np.int32).tobytes()
        out.topk_prompt_logprobs.logprobs = np.asarray(topk.logprobs, np.float32).tobytes()
    if response.target_prompt_logprobs is not None:
        _write_tensor(out.target_prompt_logprobs, response.target_prompt_logprobs)
    if response.prompt_alt_tokens is not None:
        _write_tensor(out.prompt_alt_tokens.tokens, response.prompt_alt_tokens.tokens)
        _write_tensor(out.prompt_alt_tokens.logprobs, response.prompt_alt_tokens.logprobs)
    return out.SerializeToString()


def _write_tensor(msg: pb.Tensor, tensor: types.TensorData) -> None:
    """A TensorData into the wire's Tensor, dense or sparse CSR as it is."""
    np_dtype = np.float32 if tensor.dtype == "float32" else np.int64
    msg.dtype = _OUT_DTYPES[tensor.dtype]
    msg.shape.extend(int(n) for n in tensor.shape or [])
    values = np.asarray(tensor.data, dtype=np_dtype).reshape(-1).tobytes()
    if tensor.sparse_crow_indices is not None and tensor.sparse_col_indices is not None:
        msg.sparse_csr.values = values
        msg.sparse_csr.crow_indices = np.asarray(tensor.sparse_crow_indices, np.int64).tobytes()
        msg.sparse_csr.col_indices = np.asarray(tensor.sparse_col_indices, np.int64).tobytes()
    else:
        msg.dense = values


def sampled_tokens(response: types.SampleResponse) -> int:
    return sum(
        len(s.tokens_np) if s.tokens_np is not None else len(s.tokens) for s in response.sequences
    )
