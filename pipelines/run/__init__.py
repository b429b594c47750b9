"""What more than one ``stitchrec`` command needs: the run folder, its data, the model, scoring.

* ``pipelines.run.paths``: ``RunPaths`` (the layout of a run folder) and ``Log``.
* ``pipelines.run.data``: raw files -> Parquet shards, statistics, crosses named by the config.
* ``pipelines.run.model``: model building, pair-statistics blocks, warm start, optimizers,
  saving and loading a trained model.
* ``pipelines.run.fusion``: the ``[fusion]`` transformations of a model before training.
* ``pipelines.run.scoring``: the scorer of a model, predictions and test metrics.
* ``pipelines.run.step``: the one training step every training loop and benchmark runs.
* ``pipelines.run.stage_fit``: the epochs of a pre-ranking run's models (FSCD stages, the
  two-tower model) with early stopping on validation rows.

The commands (``pipelines.train``, ``pipelines.export``, ``pipelines.preranking``, ...) import
these modules and never each other.
"""
