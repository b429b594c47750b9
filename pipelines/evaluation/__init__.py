"""Offline A/B evaluation: compare a candidate model (treatment) with a production model (control)
on the same logged data, with paired-bootstrap confidence intervals, per-slice metrics, off-policy
estimates for logs with propensities, and JSON / HTML / console reports.

Modules (math in plain numpy functions, orchestration in ``compare``):

* ``metrics``   point metrics: AUC, logloss, calibration (ratio, ECE, reliability curve), GAUC,
                NDCG@k and recall@k, and their per-group building blocks.
* ``bootstrap`` paired multinomial bootstrap: the same resampled rows for both models; exact
                integer weighted AUC from one sort per model; CIs, p-values and verdicts.
* ``offpolicy`` IPS, SNIPS, DM and doubly robust estimates of a scoring model's policy value.
* ``sources``   score sources: exported SavedModels, TF-Serving gRPC servers, Parquet score files.
* ``report``    JSON, self-contained HTML (inline SVG plots) and the console summary.
* ``compare``   ties it together; ``stitchrec ab`` calls ``compare.run_ab``.
"""
