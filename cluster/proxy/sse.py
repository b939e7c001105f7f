"""Server-sent events read exactly as the official SDKs read them, and written in the one
spelling every reader agrees on (see docs/proxy.md, "What the proxy parses").

Reading follows the decoders the `openai` and `anthropic` packages ship (their
`_streaming.py`, after the WHATWG HTML event-stream rules): lines end at CR, LF or CRLF
(bytes only: U+2028, NEL, VT or FF end no line), a CRLF split across two chunks is one
line end, each line is UTF-8 (a line that is not is an error, as the SDKs raise), a
leading BOM is *not* stripped (the SDKs keep it, so the first field name is then not
`event`/`data`), a line starting with `:` is a comment, a field value loses one leading
space, `data` lines join with LF, and a blank line dispatches the event when it has an
event name, data, an id or a retry, where the last id is kept across events as the rule
says (so after an `id:` every blank line dispatches).

Writing: `event: NAME` (when there is one) and one `data:` line of compact JSON in ASCII,
each ending with LF, then a blank line: no byte of it can be read two ways.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass

SSE_LINE_BYTES_MAX = 16 * 1024 * 1024  # one line (a data line carries a whole JSON event)
SSE_EVENT_BYTES_MAX = 16 * 1024 * 1024  # the data of one event, all its lines together
CR, LF = 13, 10
EVENT_NAME_RE = re.compile(r"[A-Za-z0-9._-]{1,128}")  # what the proxy writes after `event:`


class StreamUnreadable(ValueError):
    """The stream cannot be read as the SDK reads it (the message says why, with no
    content of the stream in it)."""


@dataclass(frozen=True)
class SseEvent:
    event: str | None  # None: no name (or an empty one), as the SDKs report it
    data: str


class SseDecoder:
    """Incremental: `feed` bytes as they arrive, get the events they complete."""

    def __init__(self) -> None:
        self._line = bytearray()
        self._skip_lf = False  # the last chunk ended with CR: a leading LF is its CRLF
        self._event: str | None = None
        self._data: list[str] = []
        self._data_bytes = 0
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        return [e for line in self._lines(chunk) if (e := self._decode(line)) is not None]

    def _lines(self, chunk: bytes) -> list[bytes]:
        # bytes.splitlines ends lines at CR, LF and CRLF only: the SDKs' line ends
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        if self._line:
            self._extend(chunk)
            chunk = bytes(self._line)
            self._line.clear()
        parts = chunk.splitlines(keepends=True)
        if parts[-1][-1] not in (CR, LF):
            self._extend(parts.pop())  # a line still coming
        elif parts[-1][-1] == CR:
            self._skip_lf = True  # its LF, if one comes first in the next chunk, is its own
        return [p[:-2] if p.endswith(b"\r\n") else p[:-1] for p in parts]

    def _extend(self, part: bytes) -> None:
        if len(self._line) + len(part) > SSE_LINE_BYTES_MAX:
            raise StreamUnreadable(f"a line longer than {SSE_LINE_BYTES_MAX} bytes")
        self._line += part

    def _decode(self, raw: bytes) -> SseEvent | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise StreamUnreadable("a line that is not UTF-8") from None
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data_bytes += len(raw)
            if self._data_bytes > SSE_EVENT_BYTES_MAX:
                raise StreamUnreadable(f"an event larger than {SSE_EVENT_BYTES_MAX} bytes")
            self._data.append(value)
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry":
            with contextlib.suppress(ValueError):
                self._retry = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._event and not self._data and not self._last_id and self._retry is None:
            return None
        event = SseEvent(self._event or None, "\n".join(self._data))
        self._event, self._data, self._data_bytes, self._retry = None, [], 0, None
        return event


_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def dumps(value: object) -> str:
    """Compact JSON in ASCII (every other character escaped), NaN and infinities refused."""
    return _ENCODER.encode(value)


def frame(event: str | None, data: object) -> bytes:
    """One event as the proxy writes it. An event name comes from the upstream's data (its
    `type`): one that is not a plain name is refused, as it could end the line and start
    another field."""
    if event is not None and not EVENT_NAME_RE.fullmatch(event):
        raise StreamUnreadable("an event name that is not a plain name")
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {dumps(data)}\n\n".encode("ascii")


def done_frame() -> bytes:
    return b"data: [DONE]\n\n"
