"""bench/serving: gRPC serving load test beside Triton (run ``python -m bench.serving``)."""
