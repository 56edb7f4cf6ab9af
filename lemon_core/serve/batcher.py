"""Micro-batching: concurrent requests are collected for a few milliseconds and served as one batch.

The executor batches every agent call of a DAG level across all specs it is given, and backends
batch too (one padded forward pass, one vLLM step). Batching many users' requests therefore costs
about as much as one request. The worker waits ``max_wait_s`` after the first request of a batch
(or until ``max_size`` requests are in) and runs the blocking batch function in a worker thread, off
the event loop, one batch at a time; requests arriving meanwhile form the next batch. One batch at a
time also means in-process models are never called from two threads at once.

A caller that stops waiting (its client went away) cancels its future: a job not yet in a batch is
dropped (a job already running is the batch function's to skip: see ``Job.abandoned`` in
serve/orchestrator.py). The worker thread is a daemon: on shutdown ``stop`` fails what is
still queued and does not wait for a batch stuck in a slow backend, so the process can exit within
the pod's grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
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
        self.running: list[asyncio.Future[R]] = []  # futures of the batch in the worker thread now

    def start(self) -> None:
        """Start the worker on the running event loop."""
        self._queue = asyncio.Queue()
        self._worker = asyncio.get_running_loop().create_task(self._work(), name="lemon-batcher")

    async def stop(self) -> None:
        """Stop taking batches and fail every queued or running job; never waits for the worker thread."""
        running = list(self.running)
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        pending = [future for _, future in self._drain()] + running
        for future in pending:
            if not future.done():
                future.set_exception(ShuttingDown("service is shutting down"))

    def _drain(self) -> list[tuple[J, asyncio.Future[R]]]:
        items = []
        while self._queue is not None and not self._queue.empty():
            items.append(self._queue.get_nowait())
        return items

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
        while True:
            batch = await self._collect()
            if not batch:
                continue
            self.stats.batches += 1
            self.stats.items += len(batch)
            self.stats.largest = max(self.stats.largest, len(batch))
            self.running = [future for _, future in batch]
            try:
                results = await _in_daemon_thread(self.run_batch, [job for job, _ in batch])
                if len(results) != len(batch):
                    raise RuntimeError(f"run_batch returned {len(results)} results for {len(batch)} jobs")
            except Exception as e:  # noqa: BLE001 - handed to every caller; the worker keeps going
                log.exception("batch of %d requests failed", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            finally:
                self.running = []
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result(result)


class ShuttingDown(RuntimeError):
    """The service stopped before this job's batch finished."""


async def _in_daemon_thread(fn: Callable[[list[J]], list[R]], jobs: list[J]) -> list[R]:
    """``fn(jobs)`` in a new daemon thread; awaiting it can be cancelled without waiting for the thread.

    Not a ThreadPoolExecutor: the interpreter joins those threads at exit, so a batch stuck in a slow
    backend would hold a terminating pod past its grace period.
    """
    loop = asyncio.get_running_loop()
    done: asyncio.Future[list[R]] = loop.create_future()

    def deliver(result: list[R] | None, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)  # type: ignore[arg-type]

    def target() -> None:
        try:
            result, error = fn(jobs), None
        except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, e
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody is waiting
            loop.call_soon_threadsafe(deliver, result, error)

    threading.Thread(target=target, name="lemon-batch", daemon=True).start()
    return await done
