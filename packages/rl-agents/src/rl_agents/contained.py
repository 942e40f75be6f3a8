"""An agent episode run where nothing it does reaches the endpoint or another episode: a daemon thread of its own
and, for an async agent, an event loop of its own. Whatever it raises (``SystemExit`` and ``KeyboardInterrupt``
included) becomes its episode's error; a blocked loop or a hung child process blocks its thread alone, which is
abandoned when the episode's time is up and never holds the process open at exit."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable, Mapping
from typing import Any


class AgentExit(Exception):
    """An agent raised a ``BaseException`` that is not an ``Exception`` (``SystemExit``, ``KeyboardInterrupt``)."""


class Contained:
    """``agent(row, client)`` started in its own thread; ``done`` its result or error."""

    def __init__(
        self,
        agent: Callable[..., Any],
        row: Mapping[str, Any],
        clients: tuple[Callable[[], Any], Callable[[], Any]],
        name: str,
    ) -> None:
        self.agent, self.row, self.clients = agent, row, clients
        self.done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        threading.Thread(target=self._main, name=name, daemon=True).start()

    def _main(self) -> None:
        try:
            if inspect.iscoroutinefunction(self.agent):
                value = self._run_async()
            else:
                value = self.agent(self.row, self.clients[1]())
            self._settle(lambda: self.done.set_result(value))
        except BaseException as exc:  # the agent's, whatever it is, ends its episode alone
            error = exc if isinstance(exc, Exception) else AgentExit(f"{type(exc).__name__}: {exc}")
            self._settle(lambda: self.done.set_exception(error))

    def _run_async(self) -> Any:
        loop = self.loop = asyncio.new_event_loop()
        client = self.clients[0]()

        async def episode() -> Any:
            try:
                return await self.agent(self.row, client)
            finally:
                await client.close()

        try:
            self.task = loop.create_task(episode())
            return loop.run_until_complete(self.task)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _settle(self, settle: Callable[[], None]) -> None:
        """Set ``done``, unless the episode was already given up on (its future cancelled)."""
        try:
            settle()
        except concurrent.futures.InvalidStateError:
            pass

    def cancel(self) -> None:
        """Give the episode up: its async agent's task cancelled when its loop next runs; a blocked one abandoned."""
        self.done.cancel()
        if self.loop is not None and self.task is not None and not self.loop.is_closed():
            try:
                self.loop.call_soon_threadsafe(self.task.cancel)
            except RuntimeError:  # closed meanwhile
                pass
