"""The gRPC inference server; it loads SavedModels and never imports ranking/.

- ``config``: BatchingConfig, VersionPolicy, Limits, ServerOptions (no TensorFlow);
- ``repository``: models/<name>/<version>/ SavedModels, version policies, polling, warmup,
  hot swap, rollback; one model instance per GPU (round robin) or one on the CPU;
- ``batching``: the dynamic batcher (max batch size, queue delay, preferred sizes, bounded queue);
- ``inference``: feature checks and the predict / rank calls every protocol shares;
- ``servicers``: RankingService, TF Serving PredictionService + ModelService, KServe v2;
- ``interceptors``: bearer-token auth and JSON access logs; ``metrics``: Prometheus;
- ``server``: ``create_server(address, repo, options) -> (server, port)``, graceful stop;
- ``client``: a Python client of the RankingService.

See docs/serving.md.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
