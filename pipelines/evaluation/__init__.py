"""The evaluation library: offline comparison of a candidate model (treatment) with a production
model (control) on the same logged data, with paired-bootstrap confidence intervals, per-slice
metrics, off-policy estimates for logs with propensities, and JSON / HTML / console reports.
``stitchrec ab`` (``pipelines.ab``) runs it.

The metric formulas (AUC, logloss, calibration, GAUC, NDCG@k, recall@k and their per-group
building blocks) are ``ranking.metrics``; this package adds what comparing two models needs
(math in plain numpy functions, orchestration in ``compare``):

* ``bootstrap`` paired multinomial bootstrap: the same resampled rows for both models; every
                metric as a kernel evaluated on a chunk of resamples at once (AUC from one
                sort per model, ``ranking.metrics.ScoreOrder``); CIs, p-values and verdicts.
* ``offpolicy`` IPS, SNIPS, DM and doubly robust estimates of a scoring model's policy value.
* ``sources``   score sources: exported SavedModels, TF-Serving gRPC servers, Parquet score files.
* ``report``    self-contained HTML and the console summary.
* ``svg``       the report's charts, written as SVG text (no plotting library).
* ``compare``   the paired comparison of two score vectors on the same rows, per slice.
* ``logged``    a server's prediction log joined with outcomes as the logs, and its scores
                (``logged:ARM`` / ``logged:vN``).
* ``unpaired``  two models each on its own rows (two logged arms): two-sample bootstrap.
* ``tasks``     the tasks of an exported model: which output scores which label.
* ``ab_run``    ties it together, task by task, and writes ``ab.json`` / ``ab.html``;
                ``ab_run.run_ab`` is the entry point.
"""
