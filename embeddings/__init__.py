"""Embedding layers of categorical fields, one table config per field.

Methods (``embeddings.collection.EMBEDDING_METHODS``): the full table (``full``), the hashing
trick (``hashing``), quotient-remainder (``qr``), binary-code hash (``bh``) and AMTL's learned
per-value lengths (``amtl``), all on the shared ``EmbeddingLayer`` (embeddings/base.py).
``EmbeddingCollection`` holds one layer per field from its ``TableConfig``
(embeddings/table_config.py); embeddings/protocols.py names the optional capabilities (a serving
form, a warm start, training counts, sizing for a compression ratio).
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
