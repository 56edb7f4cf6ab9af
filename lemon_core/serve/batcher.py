"""Micro-batching: concurrent requests are collected for a few milliseconds and served as one batch.

The executor batches every agent call of a DAG level across all specs it is given, and backends
batch too (one padded forward pass, one vLLM step). Batching many users' requests therefore costs
about as much as one request. The worker waits ``max_wait_s`` after the first request of a batch
(or until ``max_size`` requests are in) and runs the blocking batch function in its one worker
thread, off the event loop; requests arriving meanwhile form the next batch. One thread also means
in-process models are never called from two threads at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)
J = TypeVar("J")
R = TypeVar("R")


@dataclass
class BatchStats:
    batches: int = 0
    items: int = 0
    largest: int = 0

    @property
    def mean_size(self) -> float:
        return self.items / self.batches if self.batches else 0.0


class MicroBatcher(Generic[J, R]):
    """``await submit(job)`` -> ``run_batch([... job ...])[i]``, with jobs batched across callers."""

    def __init__(self, run_batch: Callable[[Sequence[J]], list[R]], max_size: int, max_wait_s: float) -> None:
        if max_size < 1 or max_wait_s < 0:
            raise ValueError(f"max_size={max_size} must be >= 1 and max_wait_s={max_wait_s} >= 0")
        self.run_batch = run_batch
        self.max_size = max_size
        self.max_wait_s = max_wait_s
        self.stats = BatchStats()
        self._queue: asyncio.Queue[tuple[J, asyncio.Future[R]]] | None = None
        self._worker: asyncio.Task[None] | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lemon-batch")

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="lemon-batcher")

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        while self._queue is not None and not self._queue.empty():
            _, future = self._queue.get_nowait()
            if not future.done():
                future.set_exception(RuntimeError("service is shutting down"))
        self._thread.shutdown(wait=True)

    async def submit(self, job: J) -> R:
        if self._queue is None:
            raise RuntimeError("MicroBatcher.start() was not called")
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((job, future))
        return await future

    async def _collect(self) -> list[tuple[J, asyncio.Future[R]]]:
        assert self._queue is not None
        batch = [await self._queue.get()]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_wait_s
        while len(batch) < self.max_size:
            left = deadline - loop.time()
            try:
                batch.append(self._queue.get_nowait() if left <= 0 else
                             await asyncio.wait_for(self._queue.get(), left))
            except (asyncio.QueueEmpty, TimeoutError):
                break
        return [(job, fut) for job, fut in batch if not fut.done()]  # drop callers that went away

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect()
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.largest = max(self.stats.largest, len(batch))
            try:
                results = await loop.run_in_executor(self._thread, self.run_batch, [job for job, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} jobs")
            except Exception as e:  # noqa: BLE001 - handed to every caller; the worker keeps going
                log.exception("batch of %d requests failed", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)
