"""The ASGI lifespan of the web server: this process's report on its CPU and memory starts and stops with it.

Only a server that serves the application sends lifespan events (uvicorn does,
by default). Tests that import ``config.asgi.application`` for Channels'
communicators, and ``manage.py`` commands, send none, so they start no
reporter. A server without lifespan support (daphne) serves as before and
does not report.
"""

from __future__ import annotations

import asyncio

from django.conf import settings

from tandem.runtime.process_reports import start_process_reporter, stop_process_reporter


async def lifespan(scope, receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            # Never raises: a web server must start even when Redis is down.
            start_process_reporter(redis_url=settings.REDIS_URL, role="web")
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            # Joins the thread and deletes the report: blocking calls, off the event loop.
            await asyncio.to_thread(stop_process_reporter)
            await send({"type": "lifespan.shutdown.complete"})
            return
