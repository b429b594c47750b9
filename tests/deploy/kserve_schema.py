"""JSON schemas of the KServe resources ``deploy/kubernetes/`` uses, written from the fields
KServe documents for ``serving.kserve.io/v1alpha1`` ServingRuntime and ``serving.kserve.io/
v1beta1`` InferenceService: the required ones, the enumerated ones (protocol versions,
deployment mode) and the types of the rest that the manifests set. The pod-level fields of a
ServingRuntime (``containers``) are checked against the Kubernetes Container schema instead."""

from __future__ import annotations

PROTOCOLS = ["v1", "v2", "grpc-v1", "grpc-v2"]

_METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

SERVING_RUNTIME = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1alpha1"},
        "kind": {"enum": ["ServingRuntime", "ClusterServingRuntime"]},
        "metadata": _METADATA,
        "spec": {
            "type": "object",
            "required": ["supportedModelFormats", "containers"],
            "additionalProperties": False,
            "properties": {
                "supportedModelFormats": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string"},
                            "version": {"type": "string"},
                            "autoSelect": {"type": "boolean"},
                            "priority": {"type": "integer", "minimum": 1},
                        },
                    },
                },
                "protocolVersions": {
                    "type": "array",
                    "items": {"enum": PROTOCOLS},
                    "uniqueItems": True,
                },
                "multiModel": {"type": "boolean"},
                "disabled": {"type": "boolean"},
                "containers": {"type": "array", "minItems": 1},
                "volumes": {"type": "array"},
                "nodeSelector": {"type": "object"},
                "tolerations": {"type": "array"},
                "annotations": {"type": "object"},
                "labels": {"type": "object"},
            },
        },
    },
}

INFERENCE_SERVICE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "serving.kserve.io/v1beta1"},
        "kind": {"const": "InferenceService"},
        "metadata": {
            **_METADATA,
            "properties": {
                **_METADATA["properties"],
                "annotations": {
                    "type": "object",
                    "additionalProperties": {"type": "string"},
                    "properties": {
                        "serving.kserve.io/deploymentMode": {
                            "enum": ["Serverless", "RawDeployment", "ModelMesh"]
                        }
                    },
                },
            },
        },
        "spec": {
            "type": "object",
            "required": ["predictor"],
            "properties": {
                "predictor": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {
                        "minReplicas": {"type": "integer", "minimum": 0},
                        "maxReplicas": {"type": "integer", "minimum": 0},
                        "model": {
                            "type": "object",
                            "required": ["modelFormat"],
                            "additionalProperties": False,
                            "properties": {
                                "modelFormat": {
                                    "type": "object",
                                    "required": ["name"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "name": {"type": "string"},
                                        "version": {"type": "string"},
                                    },
                                },
                                "runtime": {"type": "string"},
                                "storageUri": {
                                    "type": "string",
                                    "pattern": "^(gs|s3|pvc|https?|hf|oci)://.+",
                                },
                                "protocolVersion": {"enum": PROTOCOLS},
                                "args": {"type": "array", "items": {"type": "string"}},
                                "env": {"type": "array"},
                                "resources": {"type": "object"},
                            },
                        },
                    },
                }
            },
        },
    },
}

SCHEMAS = {"ServingRuntime": SERVING_RUNTIME, "InferenceService": INFERENCE_SERVICE}
