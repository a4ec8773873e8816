"""KEDA's external scaler (``externalscaler.ExternalScaler``), served over gRPC on
``scaler_listen`` by grpc.aio in warmgate's own event loop (docs/keda.md).

Each target has an :class:`ActiveSignal`: the answer of
:func:`router.cluster.keda_state.activeness`, kept current by events only (a phase change on the
target's state cell, the first request held, an idle window running out) and broadcast to every open
``StreamIsActive``, so KEDA hears ``active`` the moment a request is held for a cold target, not at
its next poll.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc
from grpc import aio

from router.cluster.combine import alone
from router.cluster.keda_proto import externalscaler_pb2 as pb
from router.cluster.keda_state import Activeness, Wants, activeness, target_concurrency
from router.cluster.replicas import Replicas
from router.config import HostPort
from router.scale.state import TargetState
from router.scale.targets import TargetRuntime

log = logging.getLogger("warmgate.keda")

SERVICE = "externalscaler.ExternalScaler"
TARGET_KEY = "target"
"""The ScaledObject trigger's metadata key that names the warmgate target."""

_Context = aio.ServicerContext[Any, Any]


def metric_name(target: str) -> str:
    """The metric KEDA's HPA scales on (KEDA prefixes it with ``s<trigger index>-``)."""
    return f"warmgate-{target}"


class ActiveSignal:
    """One target's answer to KEDA, looked at again on every event that can change it."""

    def __init__(self, runtime: TargetRuntime, replicas: Replicas | None = None) -> None:
        self.rt = runtime
        self.replicas = replicas
        """Several warmgate replicas: the answer is for all of them (held and in-flight summed,
        idle only when every one is)."""
        self._changed = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self.current = self.look()
        runtime.cell.subscribe(self._on_state)
        runtime.on_first_hold.append(self._on_hold)
        self._schedule(self.current.recheck_at)

    def look(self) -> Activeness:
        rt, replicas = self.rt, self.replicas
        together = alone(rt) if replicas is None else replicas.combined(rt.name)  # for all
        return activeness(
            Wants(
                state=rt.state,
                now=rt.loop.time(),
                idle_after=rt.learned.windows().idle_after,
                held=together.held,
                in_flight=together.in_flight,
                idle_since=together.idle_since,
                wanted_until=together.wanted_until,
            )
        )

    def update(self) -> Activeness:
        """Look now; wake the streams if ``active`` changed. Never raises (it runs inside the
        hold path and the state cell's broadcast)."""
        if self._closed:
            return self.current
        answer = self.look()
        self._schedule(answer.recheck_at)
        if answer.active != self.current.active:
            log.info(
                "%s: KEDA is told %s (%s)",
                self.rt.name,
                "active" if answer.active else "inactive",
                answer.reason,
            )
            changed, self._changed = self._changed, asyncio.Event()
            changed.set()
        self.current = answer
        return answer

    def _on_state(self, old: TargetState, new: TargetState) -> None:
        self.update()

    def _on_hold(self) -> None:
        self.update()

    def _schedule(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None if math.isinf(at) else self.rt.loop.call_at(at, self.update)

    async def changes(self) -> AsyncIterator[bool]:
        """The current value, then each change (a flip and back between two reads is no change:
        KEDA's last word is still right)."""
        sent: bool | None = None
        while not self._closed:
            changed = self._changed
            if self.current.active != sent:
                sent = self.current.active
                yield sent
            await changed.wait()

    def close(self) -> None:
        self._closed = True
        self._schedule(math.inf)
        self._changed.set()  # open streams end


class ScalerService:
    """The four RPCs; every request names its target in the trigger's metadata."""

    def __init__(
        self, runtimes: Mapping[str, TargetRuntime], replicas: Replicas | None = None
    ) -> None:
        self.runtimes = runtimes
        self.signals = {name: ActiveSignal(runtime, replicas) for name, runtime in runtimes.items()}
        if replicas is not None:  # each round of reads of the others may change the answer
            replicas.on_update.append(self._update_all)

    def _update_all(self) -> None:
        for signal in self.signals.values():
            signal.update()

    async def _signal(self, ref: pb.ScaledObjectRef, context: _Context) -> ActiveSignal:
        name = ref.scalerMetadata.get(TARGET_KEY)
        scaled = f"ScaledObject {ref.namespace}/{ref.name}"
        if not name:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{scaled}: its external-push trigger needs metadata '{TARGET_KEY}:' naming a "
                f"warmgate target (one of: {', '.join(sorted(self.signals))})",
            )
        signal = self.signals.get(name)
        if signal is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"{scaled}: warmgate has no target named {name!r} "
                f"(targets: {', '.join(sorted(self.signals))})",
            )
        return signal

    async def is_active(
        self, request: pb.ScaledObjectRef, context: _Context
    ) -> pb.IsActiveResponse:
        signal = await self._signal(request, context)
        return pb.IsActiveResponse(result=signal.update().active)

    async def stream_is_active(
        self, request: pb.ScaledObjectRef, context: _Context
    ) -> AsyncIterator[pb.IsActiveResponse]:
        signal = await self._signal(request, context)
        log.info(
            "%s: KEDA opened StreamIsActive (%s/%s)",
            signal.rt.name,
            request.namespace,
            request.name,
        )
        signal.update()
        async for active in signal.changes():
            yield pb.IsActiveResponse(result=active)

    async def get_metric_spec(
        self, request: pb.ScaledObjectRef, context: _Context
    ) -> pb.GetMetricSpecResponse:
        signal = await self._signal(request, context)
        size = target_concurrency(signal.rt.backend)
        spec = pb.MetricSpec(
            metricName=metric_name(signal.rt.name),
            targetSize=max(1, math.ceil(size)),
            targetSizeFloat=size,
        )
        return pb.GetMetricSpecResponse(metricSpecs=[spec])

    async def get_metrics(
        self, request: pb.GetMetricsRequest, context: _Context
    ) -> pb.GetMetricsResponse:
        signal = await self._signal(request.scaledObjectRef, context)
        value = signal.update().metric
        name = request.metricName or metric_name(signal.rt.name)
        metric = pb.MetricValue(metricName=name, metricValue=value, metricValueFloat=float(value))
        return pb.GetMetricsResponse(metricValues=[metric])

    def handler(self) -> grpc.GenericRpcHandler:
        ref = pb.ScaledObjectRef.FromString
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "IsActive": grpc.unary_unary_rpc_method_handler(
                    self.is_active, ref, pb.IsActiveResponse.SerializeToString
                ),
                "StreamIsActive": grpc.unary_stream_rpc_method_handler(
                    self.stream_is_active, ref, pb.IsActiveResponse.SerializeToString
                ),
                "GetMetricSpec": grpc.unary_unary_rpc_method_handler(
                    self.get_metric_spec, ref, pb.GetMetricSpecResponse.SerializeToString
                ),
                "GetMetrics": grpc.unary_unary_rpc_method_handler(
                    self.get_metrics,
                    pb.GetMetricsRequest.FromString,
                    pb.GetMetricsResponse.SerializeToString,
                ),
            },
        )

    def close(self) -> None:
        for signal in self.signals.values():
            signal.close()


_SERVER_OPTIONS = (
    ("grpc.so_reuseport", 0),  # a second warmgate on the same port must fail, not share it
    ("grpc.keepalive_time_ms", 60_000),  # a StreamIsActive to a KEDA that went away is noticed
    ("grpc.keepalive_timeout_ms", 20_000),
)


class ScalerServer:
    """The gRPC listener; started after the targets' lifecycles, stopped after the drain."""

    def __init__(
        self,
        runtimes: Mapping[str, TargetRuntime],
        listen: HostPort,
        replicas: Replicas | None = None,
    ) -> None:
        self.listen = listen
        self.service = ScalerService(runtimes, replicas)
        self._server: aio.Server | None = None
        self.port = 0

    async def start(self) -> int:
        """Bind and serve; returns the bound port. A bind failure is an :class:`OSError`."""
        server = aio.server(options=_SERVER_OPTIONS)
        server.add_generic_rpc_handlers((self.service.handler(),))
        try:
            self.port = server.add_insecure_port(str(self.listen))
        except RuntimeError as exc:  # grpc's word for "cannot bind"
            self.service.close()
            raise OSError(errno.EADDRINUSE, f"scaler_listen {self.listen}: {exc}") from exc
        self._server = server
        await server.start()
        log.info("KEDA external scaler listening on %s:%d", self.listen.host, self.port)
        return self.port

    async def stop(self, grace: float = 1.0) -> None:
        self.service.close()  # open streams end cleanly; KEDA reconnects to another replica
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
