"""StitchRec's ``RankingService``: one user plus N candidates -> scores (optionally top k)."""

from __future__ import annotations

from typing import Any

import grpc

from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving import inference, routing
from serving.codec import feature_to_numpy, features_to_numpy
from serving.inference import ServingError, invalid
from serving.rpc import ServerState, deadline, record_answer_version, route, rpc
from serving.traffic import TrafficError, check_label


def _rank_key(request: rank_pb2.RankRequest, name: str) -> Any:
    """The split key of a rank request: the first value of feature ``name`` (a user feature,
    else a candidate feature), None when the request has none."""
    for group in (request.user_features, request.candidate_features):
        if name in group:
            try:
                return routing.first_value(feature_to_numpy(name, group[name], "split key"))
            except ServingError:
                return None  # the full decode answers the bad feature
    return None


class RankingServicer(rank_grpc.RankingServiceServicer):
    def __init__(self, state: ServerState):
        self.state = state

    @rpc("Rank", rank_pb2.RankRequest)
    async def Rank(self, request: rank_pb2.RankRequest, context: grpc.aio.ServicerContext) -> Any:
        where = "RankRequest"
        if not request.model_name:
            raise invalid(f"{where}: model_name is empty")
        if request.model_version < 0:
            raise invalid(f"{where}: model_version must be >= 0, got {request.model_version}")
        label = request.version_label
        if label and request.model_version:
            raise invalid(
                f"{where}: model_version {request.model_version} and version_label {label!r} "
                f"both set; set at most one"
            )
        if label:
            try:
                check_label(label, f"{where}.version_label")
            except TrafficError as e:
                raise invalid(str(e)) from None
        limits = self.state.limits
        chosen = route(
            self.state,
            context,
            request.model_name,
            request.model_version or None,
            label or None,
            lambda name: _rank_key(request, name),
        )
        # the model first: an unknown model is NOT_FOUND before any feature is decoded
        self.state.repo.get(request.model_name, chosen.version)
        user, cands = await self.state.offload(
            lambda: (
                features_to_numpy(request.user_features, f"{where}.user_features", limits),
                features_to_numpy(
                    request.candidate_features, f"{where}.candidate_features", limits
                ),
            )
        )
        result = await inference.rank(
            self.state.repo,
            request.model_name,
            chosen.version,
            user,
            cands,
            k=request.top_k,
            output=request.output,
            deadline=deadline(context),
            limits=limits,
            strings_checked=True,
            offload=self.state.offload,
            observers=self.state.observers,
        )
        record_answer_version(result.version)
        return rank_pb2.RankResponse(
            model_name=request.model_name,
            model_version=result.version,
            scores=result.scores.tolist(),
            indices=result.indices.tolist(),
            task_scores={
                task: rank_pb2.FloatList(value=values.tolist())
                for task, values in result.tasks.items()
            },
        )
