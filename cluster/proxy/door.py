"""What the proxy does with a request and its answer before any body is read: which
paths it governs (and as which API), which it passes on, which it refuses, and which
upstream answers it judges, passes back or refuses (docs/proxy.md). Pure: the HTTP shell
(`app.py`) asks, and moves the bytes.

- A governed path (`POST /v1/messages`, `/v1/chat/completions`, `/v1/responses`) is
  judged; one known to carry no tool call (`GET /v1/models`, `GET /v1/models/{id}`,
  `POST /v1/messages/count_tokens`, `POST /v1/responses/input_tokens`) or listed by the
  operator (`[proxy] passthrough`) is passed on; any other is refused without going
  upstream. Paths are compared as the client sent them, byte for byte (no decoding, no
  normalization): the upstream may read `/v1//messages` or `/v1/%6Dessages` as
  `/v1/messages`, so they are refused, not passed.
- An answer with any 2xx status is read by the SDKs as a success, so every 2xx is
  judged; a 3xx is refused (the SDKs follow redirects, which would take the agent around
  the proxy, API key and all); 4xx and 5xx pass back (the SDKs raise on them and read no
  tool call); any other status is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

GOVERNED = {
    ("POST", "/v1/messages"): "anthropic",
    ("POST", "/v1/chat/completions"): "openai",
    ("POST", "/v1/responses"): "responses",
}
NO_TOOL_CALLS = (
    "GET /v1/models",
    "GET /v1/models/*",
    "POST /v1/messages/count_tokens",
    "POST /v1/responses/input_tokens",
)
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
PASSTHROUGH_MAX = 64
SEGMENT_RE = re.compile(r"[A-Za-z0-9._~-]+")
# what httpx undoes before the proxy reads a body (the proxy asks for `identity`, and
# passes on what it read, without the header)
DECODED_ENCODINGS = frozenset({"identity", "gzip", "deflate"})


class PassthroughError(ValueError):
    """A passthrough entry that is not `METHOD /path` (the message says why)."""


@dataclass(frozen=True)
class PathRule:
    method: str
    segments: tuple[str, ...]  # "*": any one segment

    def matches(self, method: str, path: str) -> bool:
        parts = path.split("/")[1:]
        return (
            method == self.method
            and len(parts) == len(self.segments)
            and all(
                s in ("*", p) and SEGMENT_RE.fullmatch(p)
                for s, p in zip(self.segments, parts, strict=True)
            )
        )


def parse_rule(text: str) -> PathRule:
    """`METHOD /a/b/*`: a method, then a path of plain segments (letters, digits, `.`,
    `_`, `~`, `-`), `*` standing for any one such segment."""
    method, _, path = text.partition(" ")
    if method not in METHODS:
        raise PassthroughError(f"{text!r}: starts with a method ({', '.join(METHODS)})")
    if not path.startswith("/") or path == "/":
        raise PassthroughError(f'{text!r}: a path after the method, e.g. "GET /v1/files"')
    segments = tuple(path.split("/")[1:])
    for segment in segments:
        if segment != "*" and (not SEGMENT_RE.fullmatch(segment) or segment in (".", "..")):
            raise PassthroughError(f"{text!r}: segment {segment!r} is neither plain nor *")
    rule = PathRule(method, segments)
    for method_path in GOVERNED:
        if rule.matches(*method_path):
            raise PassthroughError(f"{text!r}: {' '.join(method_path)} is judged, never passed")
    return rule


def parse_passthrough(entries: object) -> tuple[PathRule, ...]:
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
        raise PassthroughError('a list of "METHOD /path" strings')
    if len(entries) > PASSTHROUGH_MAX:
        raise PassthroughError(f"at most {PASSTHROUGH_MAX} entries")
    return tuple(parse_rule(entry) for entry in entries)


BUILT_IN = tuple(parse_rule(text) for text in NO_TOOL_CALLS)


class Route(StrEnum):
    GOVERNED = "governed"
    PASSED = "passed"
    REFUSED = "refused"


def route(
    method: str, raw_path: str, passthrough: tuple[PathRule, ...] = ()
) -> tuple[Route, str | None]:
    """How a request is handled, and for a governed one its API."""
    api = GOVERNED.get((method, raw_path))
    if api is not None:
        return Route.GOVERNED, api
    if any(rule.matches(method, raw_path) for rule in (*BUILT_IN, *passthrough)):
        return Route.PASSED, None
    return Route.REFUSED, None


class Answer(StrEnum):
    JUDGE = "judge"
    PASS = "pass"
    REFUSE = "refuse"


def answer(status: int, governed: bool) -> Answer:
    if 300 <= status <= 399 or not 200 <= status <= 599:
        return Answer.REFUSE
    if 200 <= status <= 299 and governed:
        return Answer.JUDGE
    return Answer.PASS


def readable_encoding(header: str | None) -> bool:
    """Whether every content coding the answer names is one httpx undoes for the proxy."""
    if not header:
        return True
    return all(part.strip().lower() in DECODED_ENCODINGS for part in header.split(","))
