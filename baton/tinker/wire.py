"""The protobuf messages the Tinker SDK sends and expects, read and written by hand.

The SDK (`tinker` 0.38) posts `/api/v1/forward_backward` as a `tinker_public.ForwardBackwardRequest`
(Content-Type application/x-protobuf, optionally zstd) and asks for `ForwardBackwardOutput`
and `SampleResponse` results as protobuf (`Accept: application/x-protobuf`). These few
messages are decoded and encoded here from the wire format (varints and length-delimited
fields), so baton needs neither the SDK nor its generated `_pb2` module to serve them. Field
numbers follow the SDK's `tinker/proto/tinker_public.proto` (Apache-2.0):

    ForwardBackwardRequest  1 model_id  2 seq_id  3 data (Datum)*  4 loss_fn
                            5 loss_fn_config {str: double}*  6 forward_only
                            7 loss_fn_config_v2 {str: LossConfigValue}*
    Datum                   1 model_input (Chunk)*  2 loss_fn_inputs {str: Tensor}*  3, 4 spans
    Chunk                   1 encoded_text {1 tokens: int32 bytes}  2 image  3 dmel
    Tensor                  1 dense bytes  2 sparse_csr {1 values 2 crow 3 col}  3 dtype  4 shape*
    ForwardBackwardOutput   1 loss_fn_output_type  2 ArrayRecord*  3 metrics {str: double}*
    ArrayRecord             1 type_tag  2 fields {str: BatchedTensor}*  3 num_datums
    BatchedTensor           1 data  2 offsets (int64 bytes)  3 dtype  4 trailing_shape*
    SampleResponse          1 SampledSequence*  2 prompt_logprobs (float32 bytes)  4 cache hits
    SampledSequence         1 stop_reason (0 stop, 1 length)  2 tokens (int32)  3 logprobs (float32)

`WireError` is a malformed message (the server answers 400 naming it).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DTYPES = {1: np.dtype(np.float32), 2: np.dtype(np.int64), 3: np.dtype(np.int32)}  # proto DType -> numpy
DTYPE_CODES = {"float32": 1, "int64": 2}
STOP_REASONS = {"stop": 0, "length": 1}


class WireError(ValueError):
    """A protobuf body that does not parse as the message it should be."""


# --- reading ---------------------------------------------------------------------------
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise WireError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> dict[int, list[Any]]:
    """{field number: [values]} of one message: ints for varints, bytes for length-delimited
    fields, 8 / 4 raw bytes for fixed64 / fixed32."""
    out: dict[int, list[Any]] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            value, i = _varint(buf, i)
        elif kind == 2:
            size, i = _varint(buf, i)
            if i + size > len(buf):
                raise WireError(f"field {number}: length {size} runs past the message")
            value, i = buf[i:i + size], i + size
        elif kind in (1, 5):
            width = 8 if kind == 1 else 4
            if i + width > len(buf):
                raise WireError(f"field {number}: truncated fixed-width value")
            value, i = buf[i:i + width], i + width
        else:
            raise WireError(f"field {number}: unsupported wire type {kind}")
        out.setdefault(number, []).append(value)
    return out


def _one(f: dict[int, list[Any]], n: int, default: Any) -> Any:
    return f[n][-1] if n in f else default


def _text(f: dict[int, list[Any]], n: int) -> str:
    try:
        return bytes(_one(f, n, b"")).decode()
    except UnicodeDecodeError as e:
        raise WireError(f"field {n} is not UTF-8") from e


def _packed_ints(values: list[Any]) -> list[int]:
    """A repeated int field, packed (bytes of varints) or not."""
    out: list[int] = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
            continue
        i = 0
        while i < len(v):
            x, i = _varint(v, i)
            out.append(x)
    return out


def _map(values: list[bytes]) -> dict[str, bytes | int]:
    out = {}
    for entry in values:
        e = fields(entry)
        out[_text(e, 1)] = _one(e, 2, b"")
    return out


def tensor(buf: bytes) -> np.ndarray:
    """A `Tensor` message as a dense numpy array (sparse CSR rows filled with zeros)."""
    f = fields(buf)
    code = _one(f, 3, 0)
    if code not in DTYPES:
        raise WireError(f"tensor dtype {code} is not float32 / int64 / int32")
    dtype, shape = DTYPES[code], _packed_ints(f.get(4, []))
    if 2 in f:  # sparse CSR
        s = fields(_one(f, 2, b""))
        values = np.frombuffer(_one(s, 1, b""), dtype=dtype)
        crow = np.frombuffer(_one(s, 2, b""), dtype=np.int64)
        col = np.frombuffer(_one(s, 3, b""), dtype=np.int64)
        if len(shape) != 2 or len(crow) != shape[0] + 1 or len(col) != len(values):
            raise WireError("sparse tensor: shape / crow_indices / col_indices do not agree")
        dense = np.zeros(shape, dtype=dtype)
        for r in range(shape[0]):
            dense[r, col[crow[r]:crow[r + 1]]] = values[crow[r]:crow[r + 1]]
        return dense
    raw = _one(f, 1, b"")
    if len(raw) % dtype.itemsize:
        raise WireError("tensor bytes are not a whole number of elements")
    arr = np.frombuffer(raw, dtype=dtype)
    if shape:
        if int(np.prod(shape)) != arr.size:
            raise WireError(f"tensor of {arr.size} elements does not have shape {shape}")
        arr = arr.reshape(shape)
    return arr


@dataclass
class Datum:
    tokens: list[int]
    inputs: dict[str, np.ndarray]


@dataclass
class ForwardBackward:
    model_id: str
    seq_id: int
    loss_fn: str
    forward_only: bool
    data: list[Datum]
    config: dict[str, float | str] = field(default_factory=dict)


def _datum(buf: bytes, index: int) -> Datum:
    f = fields(buf)
    tokens: list[int] = []
    for chunk in f.get(1, []):
        c = fields(chunk)
        if 1 not in c:
            kind = "image" if 2 in c else "audio (dmel)" if 3 in c else "unknown"
            raise WireError(f"data[{index}].model_input: {kind} chunks are not served here (token chunks only)")
        text = fields(_one(c, 1, b""))
        raw = _one(text, 1, b"")
        if len(raw) % 4:
            raise WireError(f"data[{index}].model_input: token bytes are not int32s")
        tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
    inputs = {k: tensor(v) for k, v in _map(f.get(2, [])).items()}
    return Datum(tokens, inputs)


def forward_backward_request(buf: bytes) -> ForwardBackward:
    f = fields(buf)
    config: dict[str, float | str] = {}
    for k, v in _map(f.get(5, [])).items():
        config[k] = struct.unpack("<d", v)[0]
    for k, v in _map(f.get(7, [])).items():
        c = fields(v)
        config[k] = struct.unpack("<d", _one(c, 1, b""))[0] if 1 in c else _text(c, 2)
    return ForwardBackward(model_id=_text(f, 1), seq_id=_one(f, 2, 0), loss_fn=_text(f, 4),
                           forward_only=bool(_one(f, 6, 0)),
                           data=[_datum(d, i) for i, d in enumerate(f.get(3, []))], config=config)


# --- writing ---------------------------------------------------------------------------
def _put_varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        out.append(b | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _key(number: int, kind: int) -> bytes:
    return _put_varint(number << 3 | kind)


def put_bytes(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _put_varint(len(data)) + data


def put_int(number: int, value: int) -> bytes:
    return _key(number, 0) + _put_varint(value)


def put_double(number: int, value: float) -> bytes:
    return _key(number, 1) + struct.pack("<d", value)


def _packed(number: int, values: list[int]) -> bytes:
    return put_bytes(number, b"".join(_put_varint(v) for v in values)) if values else b""


def forward_backward_output(outputs: list[dict[str, np.ndarray]], metrics: dict[str, float],
                            type_tag: str = "ArrayRecord") -> bytes:
    """A `ForwardBackwardOutput`: one ArrayRecord holding each field of every datum (1-D
    arrays, float32 or int64), and the metrics."""
    record = put_bytes(1, type_tag.encode()) + put_int(3, len(outputs))
    for name in (outputs[0] if outputs else {}):
        arrays = [np.ascontiguousarray(o[name]) for o in outputs]
        dtype = "int64" if arrays[0].dtype.kind in "iu" else "float32"
        arrays = [a.astype(dtype).reshape(-1) for a in arrays]
        offsets = np.cumsum([0] + [a.nbytes for a in arrays]).astype(np.int64)
        batched = (put_bytes(1, b"".join(a.tobytes() for a in arrays)) + put_bytes(2, offsets.tobytes())
                   + put_int(3, DTYPE_CODES[dtype]))
        record += put_bytes(2, put_bytes(1, name.encode()) + put_bytes(2, batched))
    out = put_bytes(1, type_tag.encode()) + put_bytes(2, record)
    for k, v in metrics.items():
        out += put_bytes(3, put_bytes(1, k.encode()) + put_double(2, float(v)))
    return out


def sample_response(sequences: list[tuple[str, list[int], list[float]]],
                    prompt_logprobs: list[float] | None = None) -> bytes:
    """A `SampleResponse`: (stop reason, tokens, logprobs) per sequence; prompt logprobs
    (NaN where none, e.g. the first prompt token) when asked for."""
    out = b""
    for reason, tokens, logprobs in sequences:
        seq = (put_int(1, STOP_REASONS[reason]) + put_bytes(2, np.asarray(tokens, np.int32).tobytes())
               + put_bytes(3, np.asarray(logprobs, np.float32).tobytes()))
        out += put_bytes(1, seq)
    if prompt_logprobs is not None:
        out += put_bytes(2, np.asarray(prompt_logprobs, np.float32).tobytes())
    return out
