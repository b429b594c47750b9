"""Generated C++ kernels: one TensorFlow op per embedding block, gather + mask + pool + concat.

From an ``EmbeddingCollection`` (embeddings/collection.py) and the structure of its ids,
``spec.build_spec`` derives a ``KernelSpec``: the tables (one per trainable table
variable), and per field the method, the row-index rule, the pooling, the mask and the output
columns. ``cpu.generate`` turns the spec into the C++ source of one op, specialized to it
(every dimension, offset, hash constant and table shape is a compile-time constant, so the
inner loops over a row unroll and vectorize), ``toolchain.compile_kernel`` compiles it with g++
against the TensorFlow wheel and caches the library by content hash, and ``ops.load``
registers the op and its gradient in the process.

Forward, for example ``b`` and field ``f`` at columns ``[o_f, o_f + d_f)`` of the output ``y``::

    v_f(i)        = the field's vector of id i, read from its table(s) through the resource
                    handle under the variable's (shared) lock, as ResourceGather does:
                      full      T[oov(i)]                 oov(i) = i if 0 <= i < rows else 0
                      hashing   T[bucket(i)]              (splitmix64, embeddings/hashing.py)
                      amtl      T[oov(i)] * M[w(i)]       M = mask per unique id, w = tf.unique's
                                                          index (the MLP mask stays in TF ops;
                                                          ``mask_rows``: M[oov(i)], tabulated)
                      amtl_serving (compact form: values V, row offsets S; forward only)
                                V[S[r] + j] for j < S[r+1] - S[r], else 0    (r = oov(i))
                      qr        Q[q] * R[r] | Q[q] + R[r] | [Q[q], R[r]]   (q, r = i // m, i % m)
                      bh        sum_j T[row_j(i)] | concat_j T[row_j(i)]   (binary_hash.py)
    y[b, o_f:o_f+d_f] = v_f(ids_f[b])                                     single-valued field
                      = sum_{k in row b} v_f(values_f[k]) / max(len_b, 1)  ragged, mean
                      = sum_{k in row b} v_f(values_f[k])                  ragged, sum
    y[b, D:]          = dense[b]                                           (optional input)

in one pass over the batch (rows split over TensorFlow's CPU thread pool). Backward (a second
generated op): per table the rows read and their gradient rows, returned as one
``tf.IndexedSlices`` per table (sparse updates, as ResourceGather's gradient), with
``g_f(k) = dy[b, o_f:o_f+d_f] / max(len_b, 1)`` (mean), ``dy[b, ...]`` (sum or single-valued):
full / hashing ``g``; amtl ``g * M[w]`` and ``dM[w] += g * T[row]``; qr mult ``g * R[r]`` /
``g * Q[q]``, add ``g`` / ``g``, concat the two halves of ``g``; bh sum ``g`` per block row,
concat block ``j``'s slice of ``g``. The dense input's gradient is ``dy[:, D:]``.

Not covered (left to the layers, reported by ``spec.build_spec`` in ``KernelSpec.uncovered``):
fields with an L2 penalty (``l2 > 0``, the penalty needs the rows in TF) or AMTL's
``length_penalty``, dense ids of rank > 1,
tables that are not plain resource variables (sharded or distributed).
"""
