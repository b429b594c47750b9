"""StitchRec's ``RankingService``: one user plus N candidates -> scores (optionally top k)."""

from __future__ import annotations

from typing import Any

import grpc

from protos import ranking_service_pb2 as rank_pb2
from protos import ranking_service_pb2_grpc as rank_grpc
from serving import inference
from serving.codec import features_to_numpy
from serving.inference import invalid
from serving.rpc import ServerState, deadline, rpc


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
        limits = self.state.limits
        # the model first: an unknown model is NOT_FOUND before any feature is decoded
        self.state.repo.get(request.model_name, request.model_version or None)
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
            request.model_version or None,
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
