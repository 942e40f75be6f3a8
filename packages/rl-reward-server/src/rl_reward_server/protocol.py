"""The server's HTTP protocol: uvicorn's h11 protocol with a deadline on each request's headers. A connection that
has not sent a request's headers whole within ``seconds`` of opening (or of its last response) is closed, so that
clients dribbling their headers a byte at a time cannot hold connections open (uvicorn bounds the headers' size,
through h11, and an idle keep-alive connection, but not the time the headers take)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)


def header_deadline_protocol(seconds: float) -> type[H11Protocol]:
    """An h11 protocol class (``uvicorn.run(http=...)``) whose connections get ``seconds`` for each request's
    headers."""

    class HeaderDeadline(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            self._arm()  # first: a pipelined request handled inside the call below disarms it again
            super().on_response_complete()

        def handle_events(self) -> None:
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request's headers arrived whole
                self._disarm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            if not self.transport.is_closing():
                log.info("closing a connection from %s: no whole request headers within %g s", self.client, seconds)
                self.transport.close()

    return HeaderDeadline
