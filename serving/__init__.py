"""The gRPC inference server; it loads SavedModels and never imports ranking/.

- ``config``: BatchingConfig, VersionPolicy, Limits, ServerOptions (no TensorFlow);
- ``repository``: models/<name>/<version>/ SavedModels, version policies, polling, hot swap,
  rollback; ``version_files``: which folders are complete versions, and writing one atomically;
- ``model_version``: one version loaded and warmed on its instances (one per GPU, round robin,
  or one on the CPU), its signatures and batcher;
- ``batching``: the dynamic batcher (max batch size, queue delay, preferred sizes, bounded queue);
- ``admission``: in-flight bounds and retry hints; ``health``: grpc.health.v1 per service and per
  model; ``reflection``: server reflection v1 and v1alpha; ``probes``: the heartbeat and the
  probe process answering ``--probe-port`` from it; ``heartbeats``: the server's side of them;
- ``inference``: feature checks and the predict / rank calls every protocol shares;
- ``traffic``: ``<model>/traffic.toml`` (version labels, traffic split, shadow), re-read when
  it changes; ``routing``: which version and arm answer a request (``choose``);
  ``shadow``: the observer mirroring calls to the shadow version off the hot path;
- ``ranking_service``: StitchRec's RankingService; ``tf_serving``: TF Serving's
  PredictionService and ModelService; ``kserve``: KServe v2's GRPCInferenceService;
- ``codec``: wire tensors of the three protocols <-> numpy; ``rpc``: the state the services
  share and the handler wrapper (errors -> gRPC status codes, metrics);
- ``calls``: the call being served and the observers of every scored call; ``log_format``: the
  prediction log's files; ``prediction_log``: the observer that writes them (sampled, buffered);
- ``interceptors``: bearer-token auth and JSON access logs; ``metrics``: Prometheus;
- ``server``: ``create_server(address, repo, options) -> (server, port)``, drain and graceful
  stop;
- ``client``: a Python client of the RankingService;
- ``testing``: a server on a background thread and a hand-checkable linear SavedModel, for
  tests and benchmarks.

See docs/serving.md.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
