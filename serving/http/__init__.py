"""HTTP serving in the gRPC server's process and event loop: TF Serving REST, KServe v2 REST
(with the binary tensor data extension) and StitchRec's ``/v1/rank`` (see ``serving.http.app``)."""

from serving.http.app import build_app, start_http
from serving.http.versions import resolve_version, route_version

__all__ = ["build_app", "resolve_version", "route_version", "start_http"]
