"""What an embedding collection returns: ``Embedded``, the field vectors in one of three forms.

* ``Form.FIELDS``: one vector per field, ``{field: [batch, d_f]}`` in the collection's field
  order (what ``EmbeddingCollection`` returns: one lookup per field);
* ``Form.CONCAT``: one block ``[batch, sum(d_f)]``, the field vectors side by side in field
  order (what one op computing every lookup at once returns);
* ``Form.STACKED``: one block ``[batch, F, d]`` of fields of one dimension ``d``.

A collection declares the form it returns (``output_form``) and a consumer of the vectors
declares the form it takes (``input_form`` of the ranking interactions); the consumer reads the
result through the method of its form, which gives the same values from any form it can be
derived from:

* ``fields()``: ``{field: [batch, d_f]}`` (FIELDS only: a block does not name its fields);
* ``concat(dense)``: ``[batch, sum(d_f) (+ n)]``, ``tf.concat`` of the field vectors (and
  ``dense``), or the CONCAT block (with ``dense`` concatenated), or the STACKED block reshaped;
* ``stacked(extra)``: ``[batch, F (+ k), d]``, ``tf.stack`` of the field vectors (and of
  ``extra``'s ``k`` vectors), or the STACKED block (``extra`` concatenated along the fields);
* ``field_sums()``: terms whose sum is each row's sum over every field's values (the wide
  term): one ``[batch]`` per field, or one for the whole block.

``Embedded`` is a ``NamedTuple`` of tensors and ``None``: a nested structure that Keras layers
return and ``tf.function`` / SavedModel signatures pass through as they do a dict of tensors.
"""

from __future__ import annotations

import enum
from typing import NamedTuple

import tensorflow as tf


class Form(enum.StrEnum):
    """The form of an ``Embedded``: per-field vectors, one concatenated or one stacked block."""

    FIELDS = "fields"
    CONCAT = "concat"
    STACKED = "stacked"

    @classmethod
    def of(cls, value: str | Form, arg: str = "output_form") -> Form:
        """``value`` as a ``Form``; a ValueError naming ``arg`` when it is none of them."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(
                f"{arg} must be one of {[f.value for f in cls]}, got {value!r}"
            ) from None


class Embedded(NamedTuple):
    """Field vectors: ``vectors`` (FIELDS) or ``block`` (CONCAT ``[batch, D]`` or STACKED
    ``[batch, F, d]``, told apart by rank); exactly one of the two is set."""

    vectors: dict[str, tf.Tensor] | None = None
    block: tf.Tensor | None = None

    @property
    def form(self) -> Form:
        if self.vectors is not None:
            return Form.FIELDS
        if self.block is None:
            raise ValueError("an Embedded needs vectors or a block, got neither")
        return Form.STACKED if self.block.shape.rank == 3 else Form.CONCAT

    def fields(self) -> dict[str, tf.Tensor]:
        """``{field: [batch, d_f]}`` in field order (the FIELDS form)."""
        if self.vectors is None:
            raise ValueError(
                f"the field vectors are one {self.form} block, which does not name its fields; "
                f"a consumer of per-field vectors needs a collection with output_form 'fields'"
            )
        return self.vectors

    def concat(self, dense: tf.Tensor | None = None) -> tf.Tensor:
        """``[batch, sum(d_f) (+ n)]``: the field vectors side by side, ``dense`` ``[batch, n]``
        (or None) after them."""
        if self.vectors is not None:
            parts = list(self.vectors.values())
        elif self.block.shape.rank == 3:  # [batch, F, d] -> [batch, F * d]: a free reshape
            shape = self.block.shape
            parts = [tf.reshape(self.block, [-1, int(shape[1]) * int(shape[2])])]
        else:
            parts = [self.block]
        parts += [dense] if dense is not None else []
        if not parts:
            raise ValueError("an interaction needs at least one field embedding or dense feature")
        return tf.concat(parts, axis=1) if len(parts) > 1 else parts[0]

    def stacked(self, extra: tf.Tensor | None = None) -> tf.Tensor:
        """``[batch, F (+ k), d]``: the field vectors stacked along axis 1, ``extra``
        ``[batch, k, d]`` (or None) after them."""
        if self.vectors is not None:
            vectors = list(self.vectors.values())
            dims = {v.shape[-1] for v in vectors} | (
                {extra.shape[-1]} if extra is not None else set()
            )
            if len(dims) != 1:
                raise ValueError(
                    f"the stacked form needs field vectors of one dimension, got {sorted(dims)}"
                )
            if extra is not None:
                vectors.extend(tf.unstack(extra, axis=1))
            return tf.stack(vectors, axis=1)
        if self.block.shape.rank != 3:
            raise ValueError(
                "the field vectors are one concat block [batch, sum(d_f)], which does not tell "
                "the fields apart; a consumer of the stacked form needs a collection with "
                "output_form 'stacked' or 'fields'"
            )
        if extra is None:
            return self.block
        if extra.shape[-1] != self.block.shape[-1]:
            raise ValueError(
                f"the stacked form needs field vectors of one dimension, got "
                f"{sorted({self.block.shape[-1], extra.shape[-1]})}"
            )
        return tf.concat([self.block, extra], axis=1)

    def field_sums(self) -> list[tf.Tensor]:
        """``[batch]`` terms whose sum is each row's sum over all fields' values: one per field
        (its ``[batch, d_f]`` summed over axis 1), or one for the block."""
        if self.vectors is not None:
            return [tf.reduce_sum(v, axis=1) for v in self.vectors.values()]
        axes = [1, 2] if self.block.shape.rank == 3 else 1
        return [tf.reduce_sum(self.block, axis=axes)]
