"""uvicorn with a bound on how long a stop may take.

On SIGTERM or Ctrl-C uvicorn closes its listeners, gives open requests (live views
included) ``graceful_s`` to finish, cancels the rest and runs the app's shutdown. A
shutdown hook, a thread or a blocked event loop would still hold the process for
ever: here, ``exit_after_s`` after the stop began (the signal, or uvicorn's own
stop), every thread's stack goes to stderr (so the log says what held it) and the
process exits with status 1.

uvicorn is imported when a server starts, not when this module loads.
"""

from __future__ import annotations

import faulthandler
import logging
import socket
from types import FrameType
from typing import Any

log = logging.getLogger("uvicorn.error")  # beside uvicorn's own "Shutting down"

EXIT_GRACE_S = 10.0  # after graceful_s, for the app's shutdown and the interpreter's exit


def serve_bounded(
    app: Any, *, graceful_s: int, exit_after_s: float | None = None, **config: Any
) -> None:
    """Serve ``app`` (uvicorn ``config`` keywords: host, port, log_level...) until
    stopped; the process is gone at most ``exit_after_s`` (default ``graceful_s`` +
    ``EXIT_GRACE_S``) after a stop begins."""
    import uvicorn

    bound_s = graceful_s + EXIT_GRACE_S if exit_after_s is None else exit_after_s

    class BoundedServer(uvicorn.Server):
        armed = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Armed where the signal lands: a loop held by a call that never returns
            # would never reach shutdown().
            super().handle_exit(sig, frame)
            self.arm()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            log.info("open requests get %gs; the process ends by %gs", graceful_s, bound_s)
            self.arm()
            await super().shutdown(sockets)

        def arm(self) -> None:
            if self.armed:
                return
            self.armed = True
            try:
                faulthandler.dump_traceback_later(bound_s, exit=True)
            except (RuntimeError, ValueError, OSError) as e:  # no usable stderr to write to
                log.warning("the stop is not bounded: %s", e)

    BoundedServer(uvicorn.Config(app, timeout_graceful_shutdown=graceful_s, **config)).run()
