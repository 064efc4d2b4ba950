"""`SimCluster`: the replicas of a scenario served by uvicorn on 127.0.0.1 in the current event loop.

uvicorn runs on asyncio only, and a cluster must outlive the task that entered it (pytest fixtures), so the
servers and step loops are plain asyncio tasks owned by the cluster and cancelled on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from types import TracebackType

import uvicorn

from llmguard_tools.sim.provider_limit import ProviderLimit
from llmguard_tools.sim.replica import Replica
from llmguard_tools.sim.scenarios import ScenarioConfig
from llmguard_tools.sim.server import build_app

__all__ = ["SimCluster"]

_START_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to its owner."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class SimCluster:
    """Async context manager running ``scenario``'s replicas; ``urls[i]`` serves ``replicas[i]``."""

    def __init__(self, scenario: ScenarioConfig, seed: int = 0, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.scenario = scenario
        self.seed = seed
        self.host = host
        self.port = port
        """Replica ``i`` listens on ``port + i``; 0: each on a free port the system picks."""
        self.replicas = [
            Replica(i, scenario.engine, scenario.faults_for(i), seed=seed, model=scenario.model)
            for i in range(scenario.replicas)
        ]
        self.provider = ProviderLimit(scenario.rate_limit) if scenario.rate_limit is not None else None
        """The provider rate limit every replica enforces together (the scenario's ``rate_limit``), if any."""
        self.urls: list[str] = []
        self._servers: list[_Server] = []
        self._serving: list[asyncio.Task[None]] = []
        self._stepping: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> SimCluster:
        loop = asyncio.get_running_loop()
        try:
            for replica in self.replicas:
                # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted connections only when the
                # listener says TCP; without it a reused connection waited out a 40 ms delayed ACK.
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                port = self.port + replica.index if self.port else 0
                try:
                    sock.bind((self.host, port))
                except OSError as exc:
                    sock.close()
                    raise OSError(exc.errno, f"cannot listen on {self.host}:{port} ({exc.strerror})") from exc
                config = uvicorn.Config(
                    build_app(replica, self.provider),
                    http="h11",
                    lifespan="off",
                    log_config=None,
                    log_level="warning",
                    access_log=False,
                    timeout_graceful_shutdown=1,
                )
                server = _Server(config)
                self._servers.append(server)
                self._stepping.append(loop.create_task(replica.run()))
                if replica.faults.neighbour is not None:
                    self._stepping.append(loop.create_task(replica.neighbour()))
                self._serving.append(loop.create_task(server.serve(sockets=[sock])))
                self.urls.append(f"http://{self.host}:{sock.getsockname()[1]}")
            await self._wait_started()
        except BaseException:
            await self._stop()
            raise
        return self

    async def _wait_started(self) -> None:
        deadline = asyncio.get_running_loop().time() + _START_TIMEOUT_S
        while not all(server.started for server in self._servers):
            for task in self._serving:
                if task.done():
                    raise RuntimeError("a simulated replica failed to start") from task.exception()
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("simulated replicas did not start in time")
            await asyncio.sleep(0.005)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._stop()

    async def _stop(self) -> None:
        for server in self._servers:
            server.should_exit = True
        await asyncio.gather(*self._serving, return_exceptions=True)
        for task in self._stepping:
            task.cancel()
        results = await asyncio.gather(*self._stepping, return_exceptions=True)
        self._serving.clear()
        self._stepping.clear()
        for result in results:
            if isinstance(result, Exception):
                raise RuntimeError("a replica's step loop crashed") from result
