"""``[data]`` of the training config: where a run's rows come from (``pipelines.config`` reads
it)."""

from __future__ import annotations

import dataclasses

from features.shards import VALIDATION_SPLITS
from features.tfrecord.address import service_address
from pipelines.config_sections import ConfigError

#: ``[data] input_format``: what the training loop reads (``pipelines.run.train_input``).
INPUT_FORMATS = ("parquet", "tfrecord")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the data comes from.

    Attributes:
      schema: schema file or shipped schema name.
      raw: raw files (any format the schema reads); converted to Parquet shards in the run's
        ``data/`` folder, split into train and test by ``test_fraction``.
      train, test: Parquet shards whose columns are the schema's fields (used as they are).
        ``test`` goes with ``train`` only: with ``raw`` the test rows are the ``test_fraction``
        split of the raw files, and a ``test`` next to ``raw`` is a ConfigError.
      validation: the validation files or shards (raw or Parquet, like ``train``/``test``); when
        given, ``validation_fraction`` is not used.
      validation_fraction: the fraction of the training rows held out as the validation split
        (never a test row); model selection and early stopping read it, never the test set.
        0: no validation split.
      validation_split: which training rows the fraction takes: ``hash`` (a sample by row
        hash and ``split_seed``, like the test split) or ``recent`` (the last rows in input
        order, files in the order given: for logs in time order whose test rows come later,
        so that selection reads the rows closest to them).
      max_bad_rows: bad raw rows to skip and count before failing (0: fail on the first).
        With ``train`` Parquet shards read as they are, a value above 0 reads them through the
        conversion into the run's ``data/`` folder instead, where bad rows are skipped and
        counted like raw ones.
      crosses: a cross artifact (``stitchrec crosses fives``) whose top ``cross_top_n`` crosses
        become hashed categorical fields computed inside the model ("": none).
      cross_top_n: how many of the artifact's ranked crosses to add.
      cross_hash_buckets: rows of every cross's table (0: per cross, twice the distinct value
        tuples the search saw, between 16 and 2^20).
      cap_hash_buckets: size each hashed field's table (``vocab = "hash"``) to the training
        split: ``min(hash_buckets, max(1024, 4 * distinct training values))`` rows
        (``features.stats.hash_rows``), fixed once with the run's statistics. false: the
        schema's ``hash_buckets``.
      input_format: what the training loop reads the training split from: ``parquet`` (the
        default: the Parquet shards, read by pyarrow in Python) or ``tfrecord`` (TFRecord
        shards written once into the run's ``data/tfrecord/train/`` and read by TensorFlow ops
        alone, ``features.tfrecord``; under parameter servers each worker reads its own share).
        Statistics, validation and test read Parquet either way.
      data_service: the address (``HOST:PORT`` or ``grpc://HOST:PORT``) of a tf.data
        service dispatcher whose workers run the TFRecord training input
        (``features.tfrecord.service``; start them with ``stitchrec data-service``): the
        training process only receives batches. Needs ``input_format = "tfrecord"`` and one
        training process (no ``[distribute]``). "": the training process reads its input.
      data_service_timeout: seconds the training loop waits for a batch from the service
        before it stops with an error (exit status 3; started again, it resumes from its
        last checkpoint): tf.data service itself waits without end for a lost worker's
        window, or for workers when none is running.
    """

    schema: str
    raw: tuple[str, ...] = ()
    train: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    validation: tuple[str, ...] = ()
    test_fraction: float = 0.2
    validation_fraction: float = 0.1
    validation_split: str = "hash"
    split_seed: int = 0
    max_bad_rows: int = 0
    crosses: str = ""
    cross_top_n: int = 10
    cross_hash_buckets: int = 0
    cap_hash_buckets: bool = True
    input_format: str = "parquet"
    data_service: str = ""
    data_service_timeout: float = 120.0

    def __post_init__(self) -> None:
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(
                f"[data] input_format {self.input_format!r} is not one of {list(INPUT_FORMATS)}"
            )
        if self.data_service:
            self._check_data_service()
        if not isinstance(self.cap_hash_buckets, bool):
            raise ConfigError(
                f"[data] cap_hash_buckets must be true or false, got {self.cap_hash_buckets!r}"
            )
        if self.cross_top_n < 1:
            raise ConfigError(f"[data] cross_top_n must be >= 1, got {self.cross_top_n}")
        if self.cross_hash_buckets < 0 or self.cross_hash_buckets == 1:
            raise ConfigError(
                f"[data] cross_hash_buckets must be 0 (auto) or >= 2, got {self.cross_hash_buckets}"
            )
        for key in ("raw", "train", "test", "validation"):
            value = getattr(self, key)
            object.__setattr__(self, key, (value,) if isinstance(value, str) else tuple(value))
        if bool(self.raw) == bool(self.train):
            raise ConfigError("[data]: give either `raw` files or `train` Parquet shards")
        if self.raw and self.test:
            raise ConfigError(
                "[data] raw and test: with `raw` files the test rows are their test_fraction "
                "split; give `test` only with `train` Parquet shards (or convert the raw "
                "files and name both splits' shards)"
            )
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"[data] test_fraction must be in [0, 1), got {self.test_fraction}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ConfigError(
                f"[data] validation_fraction must be in [0, 1), got {self.validation_fraction}"
            )
        if self.max_bad_rows < 0:
            raise ConfigError(f"[data] max_bad_rows must be >= 0, got {self.max_bad_rows}")
        if self.validation_split not in VALIDATION_SPLITS:
            raise ConfigError(
                f"[data] validation_split {self.validation_split!r} is not one of "
                f"{list(VALIDATION_SPLITS)}"
            )
        if self.validation_split != "hash" and self.validation:
            raise ConfigError(
                f"[data] validation_split = {self.validation_split!r} splits the training rows, "
                "but validation files are given: set one or the other"
            )

    def _check_data_service(self) -> None:
        if not self.data_service_timeout > 0:
            raise ConfigError(
                f"[data] data_service_timeout must be > 0 seconds, got {self.data_service_timeout}"
            )
        try:
            service_address(self.data_service)
        except ValueError as e:
            raise ConfigError(f"[data] data_service: {e}") from None
        if self.input_format != "tfrecord":
            raise ConfigError(
                f"[data] data_service needs input_format = 'tfrecord', got "
                f"{self.input_format!r} (tf.data service workers run TensorFlow ops only; the "
                "Parquet input reads in Python)"
            )
