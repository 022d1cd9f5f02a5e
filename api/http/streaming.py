"""Long answers that stream (``logs --follow``, the console's server-sent events)."""

from __future__ import annotations

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send


class FollowingResponse(StreamingResponse):
    """A stream that ends as soon as its client goes away, even while it has nothing to send
    (Starlette notices a disconnect only on the next send under ASGI 2.4)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as tasks:

            async def stream_then_stop() -> None:
                await self.stream_response(send)
                tasks.cancel_scope.cancel()

            tasks.start_soon(stream_then_stop)
            await self.listen_for_disconnect(receive)
            tasks.cancel_scope.cancel()
