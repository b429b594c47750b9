"""Triton Inference Server (from nvidia-pytriton) serving a StitchRec SavedModel, for the bench.

Run with the benchmark's own venv (``/usr/bin/python3.11``, nvidia-pytriton 0.7.0, numpy<2,
tensorflow-cpu), never with the project's::

    <venv>/bin/python bench/serving/triton_server.py --model DIR --name ctr --grpc-port P \\
        [--max-batch-size 4096] [--max-queue-delay-us 500] [--instances 1]

The model is a PyTriton Python callable that runs the SavedModel's ``serving_default`` on the
batch Triton's dynamic batcher formed. Inputs are declared ``[-1, 1]`` (batch, 1) as Triton
requires for batched models. Standalone: imports nothing from the project.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--name", default="ctr")
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    p.add_argument("--max-batch-size", type=int, default=4096)
    p.add_argument("--max-queue-delay-us", type=int, default=500)
    p.add_argument("--instances", type=int, default=1)
    args = p.parse_args()

    import numpy as np
    import tensorflow as tf
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    model = tf.saved_model.load(args.model)
    fn = model.signatures["serving_default"]
    _, specs = fn.structured_input_signature
    np_types = {tf.string: np.bytes_, tf.int64: np.int64, tf.float32: np.float32}

    def make_infer():
        @batch
        def infer(**inputs):
            feats = {k: tf.constant(v.reshape(-1)) for k, v in inputs.items()}
            out = fn(**feats)
            return {"score": out["score"].numpy().reshape(-1, 1).astype(np.float32)}

        return infer

    inputs = [Tensor(name=k, dtype=np_types[s.dtype], shape=(1,)) for k, s in sorted(specs.items())]
    outputs = [Tensor(name="score", dtype=np.float32, shape=(1,))]
    config = TritonConfig(
        grpc_address="127.0.0.1",
        http_address="127.0.0.1",
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        log_verbose=0,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=[make_infer() for _ in range(args.instances)],
            inputs=inputs,
            outputs=outputs,
            config=ModelConfig(
                max_batch_size=args.max_batch_size,
                batcher=DynamicBatcher(max_queue_delay_microseconds=args.max_queue_delay_us),
            ),
            strict=False,
        )
        triton.serve()  # blocks; the bench polls ModelReady over gRPC
    return 0


if __name__ == "__main__":
    sys.exit(main())
