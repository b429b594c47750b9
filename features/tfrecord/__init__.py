"""TensorFlow-native training input: TFRecord shards of columnar block ``tf.train.Example``s.

* ``features.tfrecord.encode``: the record layout (one Example per block of rows, one list
  feature per field) and its vectorized encoding, TensorFlow-free;
* ``features.tfrecord.crc32c``: the TFRecord framing's checksum, TensorFlow-free;
* ``features.tfrecord.manifest``: the manifest a writer leaves beside its files (rows per file,
  block size, field types) and the listing readers start from;
* ``features.tfrecord.writer``: ``TFRecordShardWriter`` (``features.shards.ShardWriter``'s
  interface) and ``parquet_to_tfrecord``, TensorFlow-free;
* ``features.tfrecord.plan``: which records an epoch (or a worker's share of it) reads, in
  which windows, from ``(seed, epoch)``;
* ``features.tfrecord.dataset``: ``make_tfrecord_dataset``, the tf.data input built from
  TensorFlow ops only (``features.dataset.make_dataset``'s signature and elements).

This ``__init__`` imports nothing, so writing never imports TensorFlow.
"""
