"""A gRPC client that behaves as KEDA's ``external-push`` scaler does against warmgate: it keeps
``StreamIsActive`` open (each message is a scale request), asks ``GetMetricSpec`` once, and polls
``GetMetrics`` and ``IsActive`` every polling interval. Optionally it scales a fake Deployment
the way KEDA does: to 1 on ``active``, to 0 once ``inactive`` has lasted the cooldown period."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

from grpc import StatusCode, aio

from router.cluster.keda_proto import externalscaler_pb2 as pb
from router.cluster.keda_proto import externalscaler_pb2_grpc as pb_grpc


@dataclass
class Poll:
    at: float
    active: bool
    metric: float


@dataclass
class FakeKeda:
    address: str
    target: str
    polling_interval: float = 0.1
    cooldown: float = 0.0
    scale: Callable[[int], None] | None = None
    """Called with the replica count KEDA would set (1 on active, 0 after the cooldown)."""
    pushes: list[tuple[float, bool]] = field(default_factory=list)
    """(loop time received, value) of every StreamIsActive message."""
    polls: list[Poll] = field(default_factory=list)
    spec: pb.GetMetricSpecResponse | None = None
    replicas: int = 0
    ended: bool = False
    stream_error: StatusCode | None = None
    """Why StreamIsActive failed; ``None`` while open or after a clean end."""
    poll_errors: list[StatusCode] = field(default_factory=list)
    _pushed: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _channel: aio.Channel | None = None

    @property
    def ref(self) -> pb.ScaledObjectRef:
        return pb.ScaledObjectRef(
            name=self.target, namespace="render", scalerMetadata={"target": self.target}
        )

    async def __aenter__(self) -> FakeKeda:
        self._channel = aio.insecure_channel(self.address)
        self.stub = pb_grpc.ExternalScalerStub(self._channel)
        self.spec = await self.stub.GetMetricSpec(self.ref)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._stream()), loop.create_task(self._poll())]
        await self.next_push()  # the current value, sent when the stream opens
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._channel is not None:
            await self._channel.close()

    @property
    def active(self) -> bool | None:
        return self.pushes[-1][1] if self.pushes else None

    async def next_push(self, within: float = 10.0) -> tuple[float, bool]:
        """Wait for the next StreamIsActive message."""
        seen = len(self.pushes)
        async with asyncio.timeout(within):
            while len(self.pushes) == seen and not self.ended:
                self._pushed.clear()
                await self._pushed.wait()
        if len(self.pushes) == seen:
            raise AssertionError("StreamIsActive ended")
        return self.pushes[seen]

    async def _stream(self) -> None:
        loop = asyncio.get_running_loop()
        cooling: asyncio.TimerHandle | None = None
        try:
            async for message in self.stub.StreamIsActive(self.ref):
                self.pushes.append((loop.time(), message.result))
                self._pushed.set()
                if cooling is not None:
                    cooling.cancel()
                    cooling = None
                if message.result:
                    self._set_replicas(max(1, self.replicas))
                elif self.replicas:
                    cooling = loop.call_later(self.cooldown, self._set_replicas, 0)
        except aio.AioRpcError as exc:
            self.stream_error = exc.code()
        finally:
            if cooling is not None:
                cooling.cancel()
        self.ended = True  # the stream is over (KEDA would reconnect after a backoff)
        self._pushed.set()

    def _set_replicas(self, replicas: int) -> None:
        if replicas != self.replicas:
            self.replicas = replicas
            if self.scale is not None:
                self.scale(replicas)

    async def _poll(self) -> None:
        loop = asyncio.get_running_loop()
        request = pb.GetMetricsRequest(
            scaledObjectRef=self.ref, metricName=f"warmgate-{self.target}"
        )
        while True:
            try:  # KEDA logs a failed poll and polls again at the next interval
                metrics = await self.stub.GetMetrics(request)
                active = await self.stub.IsActive(self.ref)
            except aio.AioRpcError as exc:
                self.poll_errors.append(exc.code())
            else:
                value = metrics.metricValues[0].metricValueFloat
                self.polls.append(Poll(loop.time(), active.result, value))
            await asyncio.sleep(self.polling_interval)
