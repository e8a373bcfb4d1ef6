"""kombu's filesystem transport, each message written whole before a consumer can see it.

kombu's own ``_put`` creates the message file under its final name and then writes it. A
worker that lists the folder in between takes an empty file, cannot decode it
(``JSONDecodeError``) and stops ("Unrecoverable error"); the message is lost. Here the
message is written under a name no consumer takes (it does not end in ``.QUEUE.msg``) and
renamed into place: a rename is atomic, so a consumer sees the whole file or nothing.
Everything else (taking a message by renaming it away, the bindings in the control folder)
is kombu's. Selected by ``CELERY_BROKER_TRANSPORT = "exampleproj.broker:Transport"``.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps


class Channel(filesystem.Channel):
    # kombu names the parameter "message" in its base class and "payload" here.
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:  # type: ignore[override]
        # kombu's name: the monotonic clock (system-wide) first, so that the folder sorts
        # oldest first whichever process wrote the message.
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, f".{name}.part")
        try:
            with open(partial, "wb") as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


class Transport(filesystem.Transport):
    Channel = Channel
