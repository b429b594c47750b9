"""The record layout of StitchRec's TFRecord shards, and its vectorized encoding (no TensorFlow).

One record is one ``tf.train.Example`` holding a **block** of exactly ``block_rows`` consecutive
rows of one file, column by column: every input field is one feature whose list holds the
block's values in row order, one value per row:

| field | feature list | value |
|---|---|---|
| numeric fields, labels | ``float_list`` (packed) | float32, a missing cell is the field's ``default`` |
| int64 fields (categoricals) | ``int64_list`` (packed varints) | a missing cell is ``-1`` |
| string fields, multi-valued and sequence fields | ``bytes_list`` | UTF-8 text, a missing cell is ``""``; a sequence is its values joined by its separator |

Every feature of every record has ``block_rows`` values: a file's last block is padded with
fill rows (the missing-cell values), which the manifest's row counts exclude
(``features.tfrecord.manifest``). So a reader parses a batch of records with one
``tf.io.parse_example`` of fixed-length features (``FixedLenFeature([block_rows])``, about twice
as fast as ragged ones for strings) and one parse covers a thousand rows, not one.

The encoding works on whole Arrow columns with numpy (varints, length prefixes and the bytes
of every row at once), then cuts the per-row byte ranges into blocks and frames each record as
TFRecord does: ``uint64 length``, ``uint32 masked_crc32c(length)``, the bytes, ``uint32
masked_crc32c(bytes)``, little-endian.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from features.columns import filled_column, one_chunk
from features.schema import FeatureKind, FeatureSpec
from features.tfrecord.crc32c import masked_crc32c

#: feature list type of a field: ``bytes`` (bytes_list), ``int64`` (int64_list), ``float``
FLOAT, INT64, BYTES = "float", "int64", "bytes"
_FEATURE_TAG = {BYTES: 0x0A, FLOAT: 0x12, INT64: 0x1A}  # Feature's oneof fields 1, 2, 3


def list_type(spec: FeatureSpec) -> str:
    """The feature list a field's values are stored in (``FLOAT``, ``INT64`` or ``BYTES``)."""
    if spec.kind in (FeatureKind.NUMERIC, FeatureKind.LABEL):
        return FLOAT
    return INT64 if spec.dtype == "int64" else BYTES


def varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of ``values`` (int64 as their two's complement, as protobuf encodes
    int64): ``(uint8 bytes of every value in order, int64 offsets[n + 1])``."""
    v = np.ascontiguousarray(values).astype(np.int64, copy=False).view(np.uint64)
    count = np.ones(v.shape, np.int64)
    for k in range(1, 10):
        count += v >= np.uint64(1 << (7 * k))
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    k = np.arange(10)[None, :]
    groups[k < count[:, None] - 1] |= 0x80
    offsets = np.zeros(v.size + 1, np.int64)
    np.cumsum(count, out=offsets[1:])
    return groups[k < count[:, None]], offsets


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


@dataclasses.dataclass(frozen=True)
class EncodedColumn:
    """One field's rows encoded: row ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (a float's 4
    bytes, an int64's varint, or a string's ``0x0a varint(length) bytes`` list entry)."""

    name: str
    kind: str  # FLOAT, INT64 or BYTES
    data: np.ndarray  # uint8
    offsets: np.ndarray  # int64[rows + 1]
    fill: bytes  # one fill row (a missing cell's value), encoded

    def feature(self, lo: int, hi: int, pad: int = 0) -> bytes:
        """The ``Feature`` message of rows ``[lo, hi)`` followed by ``pad`` fill rows."""
        payload = self.data[self.offsets[lo] : self.offsets[hi]].tobytes() + self.fill * pad
        # a BytesList is its entries as they are; a Float/Int64List one packed field 1
        inner = payload if self.kind == BYTES else b"\x0a" + _varint(len(payload)) + payload
        return bytes([_FEATURE_TAG[self.kind]]) + _varint(len(inner)) + inner


def _strings(name: str, column: pa.Array) -> EncodedColumn:
    """Each row as a BytesList entry: tag ``0x0a``, varint length, the UTF-8 bytes."""
    column = one_chunk(column)
    if column.offset:  # a slice: rebase its offsets
        column = pa.concat_arrays([column])
    buffers = column.buffers()
    width = np.int64 if pa.types.is_large_string(column.type) else np.int32
    src = np.frombuffer(buffers[1], width, len(column) + 1).astype(np.int64)
    lengths = np.diff(src)
    head, head_offsets = varint_bytes(lengths)
    head_len = np.diff(head_offsets) + 1  # the tag byte, then the length's varint
    offsets = np.zeros(len(column) + 1, np.int64)
    np.cumsum(head_len + lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    is_head = np.zeros(out.size, bool)
    starts = offsets[:-1]
    is_head[starts] = True
    out[starts] = 0x0A
    # the varint bytes of row i go to starts[i] + 1 ...: the k-th byte of its varint
    row_of_byte = np.repeat(np.arange(len(column)), head_len - 1)
    k = np.arange(head.size) - head_offsets[:-1][row_of_byte]
    pos = starts[row_of_byte] + 1 + k
    is_head[pos] = True
    out[pos] = head
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    out[~is_head] = data[src[0] : src[-1]]
    return EncodedColumn(name, BYTES, out, offsets, b"\x0a\x00")


def encode_columns(
    table: pa.Table | pa.RecordBatch, fields: Sequence[FeatureSpec]
) -> list[EncodedColumn]:
    """``EncodedColumn`` of every field of ``fields`` in ``table`` (missing cells filled as
    ``features.columns.filled_column`` fills them)."""
    out = []
    for f in fields:
        column = filled_column(table.column(f.name), f)
        kind = list_type(f)
        if kind == BYTES:
            out.append(_strings(f.name, column))
            continue
        values = np.asarray(one_chunk(column).to_numpy(zero_copy_only=False))
        if kind == FLOAT:
            data = values.astype("<f4", copy=False).view(np.uint8)
            offsets = np.arange(len(values) + 1, dtype=np.int64) * 4
            fill = struct.pack("<f", float(f.default))
        else:
            data, offsets = varint_bytes(values)
            fill = varint_bytes(np.array([-1]))[0].tobytes()
        out.append(EncodedColumn(f.name, kind, data, offsets, fill))
    return out


def example(columns: Sequence[EncodedColumn], lo: int, hi: int, pad: int = 0) -> bytes:
    """The serialized ``tf.train.Example`` of rows ``[lo, hi)`` of ``columns`` and ``pad`` fill
    rows after them."""
    entries = []
    for c in columns:
        key = c.name.encode()
        feature = c.feature(lo, hi, pad)
        entry = b"\x0a" + _varint(len(key)) + key + b"\x12" + _varint(len(feature)) + feature
        entries.append(b"\x0a" + _varint(len(entry)) + entry)
    features = b"".join(entries)
    return b"\x0a" + _varint(len(features)) + features


def frame(record: bytes) -> bytes:
    """``record`` framed as one TFRecord entry."""
    length = struct.pack("<Q", len(record))
    return b"".join(
        (
            length,
            struct.pack("<I", masked_crc32c(length)),
            record,
            struct.pack("<I", masked_crc32c(record)),
        )
    )
