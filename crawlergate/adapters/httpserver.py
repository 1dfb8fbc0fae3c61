"""uvicorn's httptools protocol with the limits a server facing the internet needs, as nginx has them.

uvicorn reads a request's headers without bound: ten requests with 100 MB of headers took the gate
to 1 GB, and a slowloris (headers sent a byte at a time) holds a connection for ever. Here the head
of a request (request line and headers) is capped in bytes and in header count (431 past either,
as nginx's ``large_client_header_buffers``), and must arrive within a time limit
(``client_header_timeout``), after which the connection is closed. Requests whose framing RFC 9112
forbids, or whose target is no path, are refused with 400 before the gate sees them.

    HeadLimits.apply(settings.server)   # before uvicorn starts, and in each worker
    uvicorn.run(app, http=LimitedHttpToolsProtocol)
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import httptools
from uvicorn._types import HTTPScope
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from crawlergate.config import ServerSettings
from crawlergate.gate.answer import LEFT_BEFORE_HEAD, SEND_PIECE_BYTES, Later, Response, pieces
from crawlergate.gate.request import Request

# What a client gets when the gate failed on its request (uvicorn's own words), before the connection closes.
_INTERNAL_ERROR = (
    b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: 21\r\nconnection: close\r\n\r\nInternal Server Error"
)
# A Host value: a registered name or an IPv4 address, or an IPv6 literal in brackets, with an optional port
# (RFC 3986 3.2.2); nginx refuses the rest ("client sent invalid host header").
_HOST = re.compile(rb"(?:[A-Za-z0-9\-._~%!$&'()*+,;=]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]{0,5})?")


class HeadLimits:
    """The limits every connection of this process applies (set once, from the settings)."""

    max_bytes = 64 * 1024
    max_headers = 100
    timeout_s = 10.0
    send_timeout_s = 60.0

    @classmethod
    def apply(cls, settings: ServerSettings) -> None:
        cls.max_bytes = settings.max_header_bytes
        cls.max_headers = settings.max_headers
        cls.timeout_s = settings.header_timeout_seconds
        cls.send_timeout_s = settings.send_timeout_seconds


class _HeadJoiningTransport:
    """The connection's transport, with each response's head held until its first body bytes.

    uvicorn writes a head and its body separately: two system calls and two TCP segments, each waking
    the client, for a page that was whole in memory. The head is held back to go out with the body in
    one write; a response without body bytes (HEAD, 304) releases it when it completes.
    """

    def __init__(self, transport: asyncio.Transport, protocol: HttpToolsProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held: bytes | None = None
        self._held_for: object = None
        # The transport's own methods uvicorn calls per request, bound once: looked up through __getattr__ on
        # every call they would cost more than the write they save.
        self.is_closing = transport.is_closing
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading
        self.get_write_buffer_size = transport.get_write_buffer_size

    def write(self, data: bytes) -> None:
        cycle = self._protocol.cycle
        # The first write of a response under way is its head (a 100 Continue comes before it starts).
        if cycle is not None and cycle is not self._held_for and cycle.response_started and not cycle.response_complete:
            self.flush()
            self._held_for = cycle
            self._held = data
            return
        if self._held is not None:
            data = self._held + data
            self._held = None
        self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


# The app's ``answer_at_once`` (adapters/asgi.py): the whole response for a request; for a request without a body
# (the last argument), a coroutine that gives the gate's answer once it waited (and the call that counts it); or None.
AnswerAtOnce = Callable[[Request, float, Any, bool], Response | Later | None]


class _InProtocol:
    """Stands for the request cycle of a request the protocol answers itself: uvicorn's callbacks (its body, its
    end) leave it alone, and the connection's loss marks it."""

    response_started = True
    response_complete = True
    disconnected = False
    keep_alive = True

    class message_event:  # noqa: N801 - the cycle's attribute uvicorn sets when the connection is lost
        @staticmethod
        def set() -> None:
            pass


class _Answering(_InProtocol):
    """A request whose answer the protocol writes once the gate has it (a fill, an L2 read): under way until then,
    so requests behind it wait their turn."""

    def __init__(self, keep_alive: bool) -> None:
        self.response_complete = False
        self.keep_alive = keep_alive
        self.began = False  # its head went out


_ANSWERED = _InProtocol()


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that refuses oversized heads (431) and closes connections whose head is late.

    A GET or HEAD the gate can answer at once (a crawler's L1 hit: ``answer_at_once`` of the app) is
    answered here, head and body in one write, without an ASGI request cycle, a task or a scope's
    messages: the gate's one decision and flow, asked from the protocol. One the gate answers itself
    after waiting (a fill, an L2 read from the disk, a page larger than a write), without a body, is
    written here too, once a task of the connection has the answer. Anything else (or anything behind
    a response still under way) goes the ASGI way, decided once: the decision rides in the scope.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        # The last bytes of the head read so far: its end ("\r\n\r\n") may straddle two reads.
        self._head_tail = b""
        self._header_count = 0
        # True from the end of a request (or the connection's start) until the next one's headers are complete.
        self._reading_head = True
        # The connection's deadlines, as loop times: its head's (from the head's first byte, or the connection's
        # start) and, idle between requests, keep-alive's. One timer watches both: it fires at the earliest
        # deadline it knows, closes a connection past one, or sleeps again until the next. A request moves the
        # deadlines later without touching the timer (two timers armed and cancelled per request were a tenth
        # of a crawler hit's cost).
        self._head_since: float | None = None
        self._idle_since: float | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._watch_at = 0.0
        # Since when the client has read nothing of what is written to it (its send buffer full), or None.
        self._stalled_since: float | None = None
        # What the request's framing rules look at: its Host headers, and the transfer codings it names.
        self._hosts = 0
        self._host = b""
        self._transfer_coding = b""
        self._content_length = False
        # The answer the protocol writes once the gate has it (a fill, an L2 read), while it waits.
        self._answering: _Answering | None = None
        # A refusal (400, 431, 505) waiting for the answers to the requests before it: it goes last, and nothing
        # after it is read.
        self._refusal: bytes | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._answer_at_once: AnswerAtOnce | None = getattr(self.app, "answer_at_once", None)
        self._writes = _HeadJoiningTransport(transport, self)
        # Answers written at once bypass the head-joining wrapper: they are whole, and nothing is held before them.
        self._write_whole = transport.write
        super().connection_made(self._writes)  # type: ignore[arg-type]
        self._head_since = self.loop.time()  # a connection that never sends a head is closed as a slow one
        self._watch(self._head_since + HeadLimits.timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._answering is not None:  # uvicorn marks the cycle of the request read last, maybe one behind it
            self._answering.disconnected = True
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return
        if self._reading_head:
            # Only the head's bytes count: a read may hold the head and the start of a large upload.
            window = self._head_tail + data
            end = window.find(b"\r\n\r\n")
            self._head_bytes += len(data) if end < 0 else max(0, end + 4 - len(self._head_tail))
            self._head_tail = window[-3:]
            if self._head_bytes > HeadLimits.max_bytes:
                self._refuse_head()
                return
        super().data_received(data)

    def on_message_begin(self) -> None:
        # uvicorn's per-request state, without its scope: a request answered at once never needs one (``_asgi_scope``).
        self.url = b""
        self.expect_100_continue = False
        self.headers = []
        self.scope = None  # type: ignore[assignment]
        # A request began: no longer idle (bytes that begin none, such as bare CRLFs, leave keep-alive's deadline).
        self._idle_since = None
        self._header_count = 0
        self._hosts = 0
        self._host = b""
        self._transfer_coding = b""
        self._content_length = False
        if self._head_since is None:  # the first request's head is timed from the connection's start
            self._head_since = self.loop.time()
            deadline = self._head_since + HeadLimits.timeout_s
            if deadline < self._watch_at:
                self._watch(deadline)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count <= HeadLimits.max_headers:
            name = name.lower()
            if name == b"host":
                self._hosts += 1
                self._host = value
            elif name == b"transfer-encoding":
                self._transfer_coding = value
            elif name == b"content-length":
                self._content_length = value.strip() not in (b"0", b"")
            elif name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._head_since = None
        if self._refusal is not None:
            return  # behind a refused request: never answered
        if self._header_count > HeadLimits.max_headers:
            self._refuse_head()  # the request never reaches the app
            return
        if self.parser.get_http_version() not in ("1.0", "1.1"):
            # "GET / HTTP/2.0" in HTTP/1 text (or 1.2, 0.9-like majors): no version this server speaks, and one
            # whose Host rules the checks below would not apply (nginx answers 505 too).
            self._refuse(b"505 HTTP Version Not Supported", b"Only HTTP/1.0 and HTTP/1.1 are spoken here.\n")
            return
        if self.url[:1] != b"/":
            self._to_origin_form()
        malformed = self._malformed()
        if malformed:
            self._refuse(b"400 Bad Request", malformed)
            return
        if self._transfer_coding and self._transfer_coding.strip().lower() != b"chunked":
            # "gzip, chunked": the body would reach the origin still coded, as if plain (nginx answers 501 too).
            self._refuse(b"501 Not Implemented", b"No transfer coding but chunked is implemented here.\n")
            return
        handed_on: dict[str, object] = {}
        if self._answer_at_once is not None and self._answered_at_once(self._answer_at_once, handed_on):
            return
        self.scope = self._asgi_scope()
        self.scope.update(handed_on)  # type: ignore[typeddict-item]
        super().on_headers_complete()

    def _asgi_scope(self) -> HTTPScope:
        """The scope uvicorn would have begun at the request's first byte (its path and method are added by
        ``on_headers_complete``)."""
        return {  # type: ignore[typeddict-item]
            "type": "http",
            "asgi": {"version": self.asgi_version, "spec_version": "2.3"},
            "http_version": "1.1",
            "server": self.server,
            "client": self.client,
            "scheme": self.scheme,  # type: ignore[typeddict-item]
            "root_path": self.root_path,
            "headers": self.headers,
            "state": self.app_state.copy(),
        }

    def on_body(self, body: bytes) -> None:
        if self._refusal is None:  # a refused request's body is nobody's (the cycle is the request's before it)
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refusal is not None:
            return
        # What comes next is the next request's head, counted afresh (a body is not, even one read after its answer).
        self._head_bytes = 0
        self._head_tail = b""
        self._reading_head = True
        # An answer the protocol gives has nothing left to hear of its request.
        if not isinstance(self.cycle, _InProtocol):
            super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        if self.scope is None or self.transport.is_closing():
            return  # the upgrade's head was refused (431, 400): nothing is upgraded
        super().handle_websocket_upgrade()

    def _answered_at_once(self, answer_at_once: AnswerAtOnce, handed_on: dict[str, object]) -> bool:
        """Ask the gate for the whole answer now, and send it; False when the request goes the ASGI way."""
        method = self.parser.get_method()
        if method not in (b"GET", b"HEAD") or self.parser.should_upgrade() or self.flow.write_paused:
            return False
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            return False  # an answer still under way: this one must wait its turn
        started = time.perf_counter()
        version = self.parser.get_http_version()
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        client = self.client
        request = Request(
            method.decode("ascii"),
            self.root_path + path,
            self.root_path.encode("ascii") + raw_path,
            parsed.query or b"",
            self.headers,
            client[0] if client else None,
            self.scheme or "http",
            version,
        )
        may_wait = not self._transfer_coding and not self._content_length and not self._over_limit()
        response = answer_at_once(request, started, handed_on, may_wait)
        if response is None:
            return False
        keep_alive = version != "1.0" and self.parser.should_keep_alive()
        if not isinstance(response, tuple):
            # What a fill asks the site as: read when the coroutine first runs, in the task.
            handed_on.update(server=self.server, scheme=self.scheme, root_path=self.root_path)
            self._answer_later(response, request, handed_on, keep_alive)
            return True
        self.cycle = _ANSWERED  # type: ignore[assignment]
        self._write_whole(self._head(response, method, keep_alive, whole=True))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()
        return True

    def _over_limit(self) -> bool:
        """Whether uvicorn's ``limit_concurrency`` (``server.max_connections``) is reached: a request that must wait
        then goes the ASGI way, to uvicorn's 503."""
        limit = self.limit_concurrency
        return limit is not None and (len(self.connections) >= limit or len(self.tasks) >= limit)

    def _head(self, response: Response, method: bytes, keep_alive: bool, *, whole: bool) -> bytes:
        """The response's status line and headers, and (``whole``) its body."""
        status, headers, body = response
        head = [STATUS_LINE[status]]
        for name, value in (*self.server_state.default_headers, *headers):
            head += (name, b": ", value, b"\r\n")
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if whole and method != b"HEAD":  # a HEAD answer's Content-Length is the GET's, and nothing follows its head
            head.append(body)
        return b"".join(head)

    def _answer_later(self, later: Later, request: Request, handed_on: dict[str, object], keep_alive: bool) -> None:
        """Write the gate's answer once it has it, in a task of the connection's: requests behind it wait their turn
        (uvicorn's pipeline), as behind any answer under way."""
        answering = self._answering = _Answering(keep_alive)
        self.cycle = answering  # type: ignore[assignment]
        task = self.loop.create_task(self._write_later(later, answering, request, handed_on))
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    async def _write_later(
        self,
        later: Later,
        answering: _Answering,
        request: Request,
        handed_on: dict[str, object],
    ) -> None:
        try:
            answered = await later
            if answered is None:  # the site answers after all: the ASGI way, the request as decided
                self._start_late_cycle(answering, request, handed_on)
                return
            sent = await self._write_answered(answered[0], request.method.encode("ascii"), answering)
            answered[1](sent if answering.disconnected else None)
        except Exception:
            self.logger.exception("Exception in ASGI application\n")  # as uvicorn says of an app's failure
            if not answering.disconnected and not answering.began:
                self._write_whole(_INTERNAL_ERROR)
            answering.keep_alive = False  # an answer cut short is told by the close
        finally:
            if self._answering is answering:
                self._answering = None
        answering.response_complete = True
        if not answering.keep_alive:
            self.transport.close()
        self.on_response_complete()

    async def _write_answered(self, response: Response, method: bytes, answering: _Answering) -> int:
        """Write ``response``; a large body in pieces, each once the client's socket took the one before. The
        body bytes written (all of them unless the client left; ``LEFT_BEFORE_HEAD`` when it left first)."""
        body = response[2]
        whole = len(body) <= SEND_PIECE_BYTES
        if answering.disconnected:
            return LEFT_BEFORE_HEAD
        head = self._head(response, method, answering.keep_alive, whole=whole)
        answering.began = True
        self._write_whole(head)
        if whole or method == b"HEAD":
            return len(body)
        sent = 0
        for piece, _ in pieces(body):
            if self.flow.write_paused:
                await self.flow.drain()
            if answering.disconnected:
                break
            self._write_whole(piece)
            sent += len(piece)
        return sent

    def _start_late_cycle(self, answering: _Answering, request: Request, handed_on: dict[str, object]) -> None:
        """Hand a request the gate passes to the site, after waiting, to an ASGI cycle of uvicorn's."""
        scope = self._asgi_scope()
        scope["headers"] = list(request.headers)
        scope["method"] = request.method
        scope["path"] = request.path
        scope["raw_path"] = request.raw_path
        scope["query_string"] = request.query
        scope.update(handed_on)  # type: ignore[typeddict-item]
        if request.http_version != "1.1":
            scope["http_version"] = request.http_version
        cycle = RequestResponseCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=False,
            keep_alive=answering.keep_alive,
            on_response=self.on_response_complete,
        )
        cycle.more_body = False  # the request had no body, and was read whole
        cycle.disconnected = answering.disconnected
        if self.cycle is answering:  # type: ignore[comparison-overlap] # nothing behind it: its loss marks this cycle
            self.cycle = cycle
        self._start_asgi_task(cycle, self.app)

    def _to_origin_form(self) -> None:
        """A target in absolute-form (MediaWiki sends its PURGEs so), as a server must accept it (RFC 9112 3.2.2):
        its path and query go on, and its authority is the request's Host, whatever a Host header said (as
        nginx reads it). Anything else is left for ``_malformed`` to refuse."""
        scheme, separator, rest = self.url.partition(b"://")
        if not separator or scheme.lower() not in (b"http", b"https") or self._hosts > 1:
            return  # two Host headers stay refused, whatever the target says
        cut = min((index for index in map(rest.find, (b"/", b"?", b"#")) if index >= 0), default=len(rest))
        authority, target = rest[:cut], rest[cut:]
        if not _HOST.fullmatch(authority):
            return
        self.url = target if target.startswith(b"/") else b"/" + target
        if self._hosts == 0 and self.parser.get_http_version() == "1.1":
            return  # still refused: an HTTP/1.1 request needs a Host header (RFC 9112 3.2)
        self.headers = [(name, value) for name, value in self.headers if name != b"host"]
        self.headers.append((b"host", authority))
        self._host, self._hosts = authority, 1

    def _malformed(self) -> bytes:
        """Why the request is refused before any app sees it (RFC 9112), for crawlers and people alike; or b""."""
        if not self.url.startswith(b"/"):
            # "*" is for server-wide OPTIONS and authority-form for CONNECT: a gate in front of one site takes
            # neither (absolute-form became a path in ``_to_origin_form``).
            return b"The request target must be a path, or an http(s) URL.\n"
        version = self.parser.get_http_version()
        if self._hosts > 1 or (self._hosts == 0 and version == "1.1"):
            return b"An HTTP/1.1 request needs exactly one Host header (RFC 9112 3.2).\n"
        if self._hosts and not _HOST.fullmatch(self._host):
            return b"The Host header is no host name or address (RFC 9112 3.2).\n"
        if self._transfer_coding and version != "1.1":
            return b"Transfer-Encoding is not HTTP/1.0 (RFC 9112 6.1).\n"
        return b""

    def on_response_complete(self) -> None:
        """uvicorn's, with keep-alive's deadline noted instead of a timer armed."""
        self._writes.flush()
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        if self.pipeline:  # the next request, read while this one was answered, starts now
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            if self.flow.read_paused and self._refusal is None:
                self.flow.resume_reading()
            return
        if self._refusal is not None:  # the answers before it are all sent: now the refusal, and the end
            self._write_whole(self._refusal)
            self.transport.close()
            return
        if self.flow.read_paused:
            self.flow.resume_reading()
        now = self.loop.time()
        if self._head_since is not None:
            # The next head began arriving while this answer was under way: the server reads it from now on, and
            # it has the whole head timeout from now (nginx reads a pipelined request only once it answered).
            self._head_since = now
            deadline = now + HeadLimits.timeout_s
        else:
            self._idle_since = now
            deadline = now + self.timeout_keep_alive
        if deadline < self._watch_at:
            self._watch(deadline)

    def pause_writing(self) -> None:
        """The client reads nothing: dropped past ``send_timeout_s`` (nginx's send_timeout), or it could hold the
        origin's connection, sending it an answer, as long as it likes."""
        super().pause_writing()
        self._stalled_since = self.loop.time()
        deadline = self._stalled_since + HeadLimits.send_timeout_s
        if deadline < self._watch_at or self._watchdog is None:
            self._watch(deadline)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled_since = None

    def _watch(self, at: float) -> None:
        """Have the connection's timer fire at loop time ``at``."""
        if self._watchdog is not None:
            self._watchdog.cancel()
        self._watch_at = at
        self._watchdog = self.loop.call_at(at, self._check_deadlines)

    def _check_deadlines(self) -> None:
        """Close the connection when its head came too slowly, it idled past keep-alive or read nothing of its answer
        past the send timeout; else sleep until the earliest deadline (or, while a request is under way and has none,
        for the shorter of the two limits)."""
        self._watchdog = None
        if self.transport is None:
            return
        now = self.loop.time()
        if self._stalled_since is not None and self._stalled_since + HeadLimits.send_timeout_s <= now:
            self.transport.abort()  # what it holds would never be read: close() would wait for it, closing or not
            return
        if self.transport.is_closing():
            if self._stalled_since is not None:  # closed with an answer left to send: watched until it is read
                self._watch(self._stalled_since + HeadLimits.send_timeout_s)
            return
        deadlines = []
        # A head read behind an answer still under way waits its turn, untimed (``on_response_complete`` times it).
        if self._head_since is not None and (self.cycle is None or self.cycle.response_complete):
            deadlines.append(self._head_since + HeadLimits.timeout_s)
        if self._idle_since is not None:
            deadlines.append(self._idle_since + self.timeout_keep_alive)
        if self._stalled_since is not None:
            deadlines.append(self._stalled_since + HeadLimits.send_timeout_s)
        if deadlines and min(deadlines) <= now:
            self.transport.close()
            return
        self._watch(min(deadlines) if deadlines else now + min(HeadLimits.timeout_s, self.timeout_keep_alive))

    def _refuse_head(self) -> None:
        self._refuse(b"431 Request Header Fields Too Large", b"Request header fields too large.\n")

    def _refuse(self, status: bytes, body: bytes) -> None:
        """Answer ``status`` and close: the request never reaches the app, nor does anything after it. Behind answers
        still under way (a pipelined request) the refusal waits for them, so answers keep the order of requests."""
        if self.transport is None or self.transport.is_closing():
            return
        refusal = (
            b"HTTP/1.1 %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (status, len(body), body)
        )
        if (self.cycle is not None and not self.cycle.response_complete) or self.pipeline:
            self._refusal = refusal
            self.flow.pause_reading()
            return
        self._writes.flush()
        self._write_whole(refusal)
        self.transport.close()
