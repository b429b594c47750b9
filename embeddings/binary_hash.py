"""Binary-code-based hash embedding, BH (Yan et al., "Binary Code based Hash Embedding for
Web-scale Applications", CIKM 2021, arXiv 2109.02471).

``BinaryHashEmbedding(num_rows, dim, block_bits=t)`` reads each id as an ``L``-bit binary code,
cuts the bits into ``n_blocks = ceil(L / t)`` blocks, turns each block into a small integer
``v_j``, and looks up one row per block in one table::

    code   = id if id < num_rows else fold(id)   (negative ids: code 0, the OOV path)
    v_j    = sum_k bit(code, p_{j,k}) * 2**k     (k = the bit's position INSIDE block j)
    row_j  = offset_j + v_j,  offset_j = sum_{i<j} 2**t_i
    e(id)  = sum_j T[row_j]                      (fusion "sum"; T: [sum_j 2**t_j, dim])
           = concat_j T[row_j]                   (fusion "concat"; T: [.., dim / n_blocks])

Splits (``p_{j,k}``, bit 0 = least significant):

* ``succession``: block j holds the consecutive bits ``j*t .. min((j+1)*t, L) - 1``
  (``p_{j,k} = j*t + k``); the last block holds ``t_last = L - (n_blocks-1)*t`` bits when ``t``
  does not divide ``L``, and its table part has ``2**t_last`` rows (not padded to ``2**t``);
* ``skip``: block j holds the bits ``j, j + n_blocks, j + 2*n_blocks, ...`` below ``L``
  (``p_{j,k} = j + k*n_blocks``), ``t_j = ceil((L - j) / n_blocks)`` bits.

The in-block weight is ``2**k`` with ``k`` the LOCAL position: the public QunBB implementation
weights skip blocks by the global bit position, which indexes far outside its table.

Both splits partition the ``L`` bits, so distinct codes below ``2**L`` get distinct tuples
``(v_0, .., v_{n-1})``: no two ids share all their rows (the paper's "no collision"). Codes
``< num_rows`` are vocabulary ids and keep their value. Codes ``>= num_rows`` (the
preprocessor's 63-bit fingerprints of unseen values) are folded into the rest of the code space,
``num_rows + (code - num_rows) mod (2**L - num_rows)``, so an unseen value never shares its code
with a known one, and gets a deterministic embedding without any OOV row. The default
``L = bits(num_rows - 1) + 1`` leaves at least ``num_rows`` codes for unseen values; with
``L = 63`` no fold is needed and every value, seen or not, has its own code.

Size: ``sum_j 2**t_j`` rows, between ``2 * L`` (``t = 1``) and ``2**L`` (``t = L``); BH cannot go
below ``2 * n_blocks`` rows, i.e. ``2 * L * dim`` floats with ``sum`` fusion.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from embeddings import common
from embeddings.base import EmbeddingLayer

SPLITS = ("succession", "skip")
FUSIONS = ("sum", "concat")
#: largest table accepted, in rows (2**32): beyond it, lower block_bits
MAX_ROWS = 1 << 32


def block_positions(code_bits: int, block_bits: int, split: str) -> list[list[int]]:
    """Global bit positions of each block, in local order (``[j][k] = p_{j,k}``)."""
    n = common.ceil_div(code_bits, block_bits)
    if split == "succession":
        return [list(range(j * block_bits, min((j + 1) * block_bits, code_bits))) for j in range(n)]
    return [list(range(j, code_bits, n)) for j in range(n)]


def _table_layout(
    num_rows: int, dim: int, code_bits: int, block_bits: int, split: str, fusion: str
) -> tuple[int, int, int]:
    """``(n_blocks, table rows, block dim)`` or ValueError."""
    blocks = block_positions(code_bits, block_bits, split)
    n = len(blocks)
    if fusion == "concat" and dim % n:
        raise ValueError(
            f"dim must be divisible by n_blocks={n} with fusion 'concat' (code_bits={code_bits}, "
            f"block_bits={block_bits}), got {dim!r}"
        )
    rows = sum(1 << len(b) for b in blocks)
    return n, rows, dim // n if fusion == "concat" else dim


def default_code_bits(num_rows: int) -> int:
    """``bits(num_rows - 1) + 1`` (at most 63): the vocabulary ids plus as many unseen codes."""
    return min(common.bits_for(num_rows) + 1, 63)


@tf.keras.utils.register_keras_serializable(package="stitchrec")
class BinaryHashEmbedding(EmbeddingLayer):
    """BH embedding; see the module docstring for the formula.

    ids (codes) int ``[batch]`` -> ``[batch, dim]``; ragged ``[batch, None]`` -> ``[batch, dim]``
    pooled by ``combiner``.

    Args:
      num_rows: vocabulary rows of the field (id 0 = OOV); sets the default ``code_bits`` and
        the size the ratio is measured on.
      dim: embedding dimension (divisible by ``n_blocks`` for ``concat``).
      combiner: pooling of ragged ids: ``mean`` or ``sum``.
      l2: L2 penalty on the block rows looked up (``l2 * sum(T[row_j]**2) / n_ids``).
      block_bits: ``t`` in ``[1, code_bits]``, bits per block.
      code_bits: ``L`` in ``[bits(num_rows - 1), 63]``; None: ``bits(num_rows - 1) + 1`` (at
        most 63), one bit more than the vocabulary ids need, for unseen values.
      split: ``succession`` or ``skip``.
      fusion: ``sum`` or ``concat``.
      initializer: initializer of the table.
    """

    #: the option that sets the table size, and the others ``options_for_ratio`` takes
    size_options: ClassVar[tuple[str, ...]] = ("block_bits",)
    ratio_options: ClassVar[tuple[str, ...]] = ("code_bits", "split", "fusion")

    def __init__(
        self,
        num_rows: int,
        dim: int,
        *,
        block_bits: int,
        code_bits: int | None = None,
        split: str = "succession",
        fusion: str = "sum",
        **kwargs: Any,
    ):
        super().__init__(num_rows, dim, **kwargs)
        needed = common.bits_for(num_rows)
        if code_bits is None:
            code_bits = default_code_bits(num_rows)
        common.check_int("code_bits", code_bits, 1, 63)
        if code_bits < needed:
            raise ValueError(
                f"code_bits={code_bits} cannot give the num_rows={num_rows} vocabulary ids "
                f"distinct codes; it must be >= {needed}"
            )
        common.check_int("block_bits", block_bits, 1, code_bits)
        common.check_choice("split", split, SPLITS)
        common.check_choice("fusion", fusion, FUSIONS)
        self.n_blocks, self.table_rows, self.block_dim = _table_layout(
            num_rows, dim, code_bits, block_bits, split, fusion
        )
        if self.table_rows > MAX_ROWS:
            raise ValueError(
                f"block_bits={block_bits} makes a table of {self.table_rows} rows, more than "
                f"{MAX_ROWS}; use a smaller block_bits"
            )
        self.code_bits = code_bits
        self.block_bits = block_bits
        self.split = split
        self.fusion = fusion
        blocks = block_positions(code_bits, block_bits, split)
        sizes = [len(b) for b in blocks]
        self.block_sizes = sizes
        self.offsets = [int(x) for x in np.cumsum([0] + [1 << s for s in sizes[:-1]])]
        # [n_blocks, t_max] global positions (public: the generated embedding op reads them) and
        # in-block weights 2**k (0 for padding)
        t_max = max(sizes)
        self.positions = np.zeros((self.n_blocks, t_max), np.int64)
        self._weights = np.zeros((self.n_blocks, t_max), np.int64)
        for j, b in enumerate(blocks):
            self.positions[j, : len(b)] = b
            self._weights[j, : len(b)] = [1 << k for k in range(len(b))]

    @property
    def table_shape(self) -> tuple[int, int]:
        return (self.table_rows, self.block_dim)

    def block_indices(self, codes: tf.Tensor) -> tf.Tensor:
        """Table rows ``offset_j + v_j`` of each code: int64 ``[n, n_blocks]`` for codes ``[n]``."""
        codes = tf.cast(codes, tf.int64)
        codes = tf.where(codes < 0, tf.zeros_like(codes), codes)
        space = (1 << self.code_bits) - self.num_rows  # codes left for unseen values
        if self.code_bits < 63 and space > 0:
            folded = self.num_rows + tf.math.floormod(codes - self.num_rows, space)
            codes = tf.where(codes >= self.num_rows, folded, codes)
        codes = tf.bitwise.bitwise_and(codes, tf.constant((1 << self.code_bits) - 1, tf.int64))
        if self.split == "succession":
            shifts = tf.constant([j * self.block_bits for j in range(self.n_blocks)], tf.int64)
            masks = tf.constant([(1 << s) - 1 for s in self.block_sizes], tf.int64)
            values = tf.bitwise.bitwise_and(tf.bitwise.right_shift(codes[:, None], shifts), masks)
        else:
            bits = tf.bitwise.bitwise_and(
                tf.bitwise.right_shift(codes[:, None, None], tf.constant(self.positions)),
                tf.constant(1, tf.int64),
            )
            values = tf.reduce_sum(bits * tf.constant(self._weights), axis=-1)
        return values + tf.constant(self.offsets, tf.int64)

    def call(self, ids: tf.Tensor | tf.RaggedTensor) -> tf.Tensor:
        # [n, n_blocks, bd]; embedding_lookup also reads a ShardedVariable shard by shard
        rows = tf.nn.embedding_lookup(self.table, self.block_indices(common.flat_ids(ids)))
        if self.fusion == "sum":
            vectors = tf.reduce_sum(rows, axis=1)
        else:
            vectors = tf.reshape(rows, [-1, self.dim])
        return common.pool_and_regularize(self, ids, vectors, components=[rows])

    @staticmethod
    def options_for_ratio(
        num_rows: int,
        dim: int,
        ratio: float,
        *,
        code_bits: int | None = None,
        split: str = "succession",
        fusion: str = "sum",
        tolerance: float = common.RATIO_TOLERANCE,
    ) -> dict[str, Any]:
        """The ``block_bits`` whose table bytes come closest (in log scale) to
        ``num_rows * dim * 4 / ratio``, with ``L = max(bits(num_rows - 1), code_bits)``.

        Returns ``{"code_bits", "block_bits", "split", "fusion"}``. The reachable ratios are a
        discrete set (one per ``block_bits``), the largest at ``block_bits = 1`` (``2 * L`` rows);
        ``skip`` balances the blocks, so its set is coarser than ``succession``'s. A ratio off
        the closest one by more than ``tolerance``x raises ValueError listing the set.
        """
        common.check_common_args(num_rows, dim, "mean", 0.0)
        common.check_choice("split", split, SPLITS)
        common.check_choice("fusion", fusion, FUSIONS)
        common.check_ratio(ratio, tolerance)
        bits = default_code_bits(num_rows)
        if code_bits is not None:
            bits = max(common.bits_for(num_rows), common.check_int("code_bits", code_bits, 1, 63))
        full = num_rows * dim * 4
        found: dict[int, int] = {}  # block_bits -> serve bytes
        for t in range(1, bits + 1):
            try:
                _, rows, block_dim = _table_layout(num_rows, dim, bits, t, split, fusion)
            except ValueError:
                continue  # concat with dim not divisible by n_blocks
            if rows <= MAX_ROWS:
                found[t] = rows * block_dim * 4
        if not found:
            raise ValueError(
                f"BinaryHashEmbedding: no block_bits fits dim={dim} with fusion {fusion!r} "
                f"and code_bits={bits}"
            )
        best = min(found, key=lambda t: (common.log_distance(full / found[t], ratio), t))
        reachable = sorted({float(f"{full / b:.3g}") for b in found.values()})
        common.ratio_or_raise(
            f"BinaryHashEmbedding({split}, {fusion}, code_bits={bits})",
            num_rows,
            dim,
            ratio,
            found[best],
            f"reachable: {', '.join(f'{r:g}x' for r in reachable)}",
            tolerance,
        )
        return {"code_bits": bits, "block_bits": best, "split": split, "fusion": fusion}

    def options_config(self) -> dict[str, Any]:
        return {
            "code_bits": self.code_bits,
            "block_bits": self.block_bits,
            "split": self.split,
            "fusion": self.fusion,
        }
