"""Web Bot Auth: a request its agent's operator signed (HTTP Message Signatures, RFC 9421), checked.

The signature tagged ``web-bot-auth`` is the one looked at. ``Signature-Agent`` names the operator's origin;
only origins of ``rules/agents.toml`` are believed (their key directories are fetched off the request path,
``keydirectory.py``). A signature is valid when it covers ``@authority`` and ``signature-agent``, its
``created``/``expires`` hold now (within the clock-skew allowance), its ``keyid`` is the thumbprint of a key
the directory publishes, its nonce was not seen before within its lifetime, and the Ed25519 signature over
the RFC 9421 signature base verifies (http-message-signatures builds and checks it). A key the directory did
not publish when last fetched, over a minute ago, has it fetched again (the operator may have rotated its
keys): the request is judged as unsigned meanwhile.

Outcomes: ``verified`` (the operator's agent), ``pending`` (its keys are not known yet: judged without the
signature while they are fetched), ``invalid`` with the reason (never more trusted than without a signature).
With ``trust_s`` (0 by default), an (origin, key, client address) verified recently is believed for that long
without checking the signature's bytes: whoever shares the address then counts as the agent, with any
signature naming its key. Nonces are remembered per process.

    signed = SignedAgents(operators, directories, skew_s=60, trust_s=30)
    check = signed.check("GET", b"/t/1", headers, client="192.0.2.7")
"""

from __future__ import annotations

import datetime
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import http_sf
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from http_message_signatures import HTTPMessageVerifier, HTTPSignatureKeyResolver, algorithms
from http_message_signatures.exceptions import HTTPMessageSignaturesException

from crawlergate.suspect.agents import Operators, origin_of
from crawlergate.suspect.keydirectory import KeyDirectories

logger = logging.getLogger(__name__)

TAG = "web-bot-auth"
# A signature valid for longer than this is refused (the drafts ask for minutes; ChatGPT agent signs for an hour).
MAX_LIFETIME_S = 3600
# Nonces and trusted (origin, key, client) remembered at most; the oldest are forgotten first.
REMEMBERED = 65536
# Headers longer than this, more signatures than this, or a longer nonce are an attacker's, not an agent's:
# not parsed further (the library parses every signature of a request).
MAX_HEADER_BYTES = 4096
MAX_SIGNATURES = 4
MAX_QUOTED = 32
MAX_NONCE_CHARS = 256


@dataclass(frozen=True, slots=True)
class SignatureCheck:
    """What a signed request's signature says: ``outcome`` verified, pending or invalid; the operator's name
    (when its origin is listed) and, for an invalid one, why."""

    outcome: str
    operator: str = ""
    reason: str = ""


class _Fields:
    """A request's header lines as http-message-signatures reads them."""

    __slots__ = ("_lines",)

    def __init__(self, headers: Sequence[tuple[bytes, bytes]]) -> None:
        self._lines = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]

    def items(self) -> list[tuple[str, str]]:
        return self._lines

    def __iter__(self) -> Any:
        return iter(dict.fromkeys(name for name, _ in self._lines))

    def __contains__(self, name: object) -> bool:
        return any(field.lower() == str(name).lower() for field, _ in self._lines)


@dataclass(slots=True)
class _Message:
    method: str
    url: str
    headers: _Fields


class _OneKey(HTTPSignatureKeyResolver):
    def __init__(self, keyid: str, key: Ed25519PublicKey) -> None:
        self._keyid = keyid
        self._key = key

    def resolve_public_key(self, key_id: str) -> Ed25519PublicKey | None:
        return self._key if key_id == self._keyid else None


class SignedAgents:
    """Checks Web Bot Auth signatures against the listed operators' key directories."""

    def __init__(
        self,
        operators: Operators,
        directories: KeyDirectories,
        *,
        skew_s: float,
        trust_s: float,
        public_url: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.operators = operators
        self.directories = directories
        self.skew_s = skew_s
        self.trust_s = trust_s
        # The authority a signature must name, the site's public one: without a public URL there is nothing to
        # hold a signature against (one made for another site would verify), so none is believed.
        public = urlsplit(public_url)
        self._public_scheme = public.scheme or "http"
        self._public_authority = authority(public.netloc, self._public_scheme) if public.netloc else ""
        self._unanchored_warned = False
        self._clock = clock
        self._nonces: OrderedDict[int, float] = OrderedDict()
        self._trusted: OrderedDict[tuple[str, str, str], float] = OrderedDict()

    def check(
        self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], client: str | None
    ) -> SignatureCheck | None:
        """The signature's verdict; None when the request carries no ``web-bot-auth`` signature, or the site's
        public URL is not known. ``target`` is the request's path and query as sent; a signature made for another
        authority than the public URL's fails, rather than verifying here."""
        inputs, signatures, agent, host = _fields(headers)
        if not inputs or not self._anchored():
            return None
        scheme, public_host = self._public_scheme, self._public_authority
        if not target.startswith(b"/") or _oversized(inputs, signatures):
            return _invalid("malformed")
        try:
            members = http_sf.parse(inputs.encode("latin-1"), tltype="dictionary")
        except (http_sf.StructuredFieldError, ValueError):
            return _invalid("malformed")
        assert isinstance(members, dict)
        if len(members) > MAX_SIGNATURES:
            return _invalid("malformed")
        found = next(((label, member) for label, member in members.items() if _params(member).get("tag") == TAG), None)
        if found is None:
            return None
        label, member = found
        inner: Any = member if isinstance(member, tuple) and isinstance(member[0], list) else ([], {})
        components: list[Any] = inner[0]
        params: dict[str, Any] = inner[1]
        origin = _agent_origin(agent, components)
        if origin is None:
            return _invalid("no-agent")
        operator = self.operators.name_of(origin)
        if operator is None:
            return _invalid("unknown-operator")
        failed = self._check_params(components, params, host, scheme, public_host)
        if failed:
            return SignatureCheck("invalid", operator, failed)
        keys = self.directories.keys(origin)
        if keys is None:
            return SignatureCheck("pending", operator)
        keyid: str = params["keyid"]
        published = keys.get(keyid)
        now = self._clock()
        if published is None and self.directories.refetch_for_unknown_key(origin):
            return SignatureCheck("pending", operator)  # judged as unsigned until the directory is read again
        if published is None or not published.valid_at(now):
            return SignatureCheck("invalid", operator, "unknown-key")
        nonce = params.get("nonce")
        # A nonce is remembered by its hash: a table of long nonces would hold their bytes.
        seen = hash(nonce) if isinstance(nonce, str) else None
        if seen is not None and self._nonces.get(seen, 0.0) > now:
            return SignatureCheck("invalid", operator, "replayed")
        trusted = (origin, keyid, client or "")
        if self._trusted.get(trusted, 0.0) <= time.monotonic():
            # The URL of the public authority the Host was found equal to, never of the Host as sent.
            message = _Message(method, f"{scheme}://{public_host}{target.decode('latin-1')}", _Fields(headers))
            resolver = _OneKey(keyid, published.key)
            verifier = HTTPMessageVerifier(signature_algorithm=algorithms.ED25519, key_resolver=resolver)
            verifier.max_clock_skew = datetime.timedelta(seconds=self.skew_s)
            try:
                verifier.verify(message, expect_tag=TAG, expect_label=label, max_age=None)
            except HTTPMessageSignaturesException:
                return SignatureCheck("invalid", operator, "bad-signature")
            if self.trust_s > 0:
                _remember(self._trusted, trusted, time.monotonic() + self.trust_s)
        if seen is not None:
            _remember(self._nonces, seen, float(params["expires"]) + self.skew_s)
        return SignatureCheck("verified", operator)

    def _anchored(self) -> bool:
        """Whether signatures can be believed: the site's public URL is known (said once when it is not)."""
        if not self._public_authority and not self._unanchored_warned:
            self._unanchored_warned = True
            logger.warning(
                "a request carries a Web Bot Auth signature, but server.public_url is not set: signatures are not "
                "checked (one made for another site would verify here), the request is judged as if unsigned"
            )
        return bool(self._public_authority)

    def _check_params(
        self, components: list[Any], params: dict[str, Any], host: str, scheme: str, public_host: str
    ) -> str:
        """Why the signature's parameters and coverage cannot be valid now; "" when they can."""
        created, expires, keyid = params.get("created"), params.get("expires"), params.get("keyid")
        if type(created) is not int or type(expires) is not int or not isinstance(keyid, str):
            return "malformed"
        nonce = params.get("nonce")
        if nonce is not None and (not isinstance(nonce, str) or len(nonce) > MAX_NONCE_CHARS):
            return "malformed"
        now = self._clock()
        if created > now + self.skew_s or not 0 < expires - created <= MAX_LIFETIME_S:
            return "malformed"
        if expires < now - self.skew_s:
            return "expired"
        covered = {name for name, _ in components if isinstance(name, str)}
        if "@authority" not in covered or "signature-agent" not in covered:
            return "uncovered"
        if authority(host, scheme) != public_host:
            return "authority"
        return ""


def _oversized(inputs: str, signatures: str) -> bool:
    """More than an agent sends, told by counting before anything is parsed (the library parses every
    signature, component and parameter): a header over MAX_HEADER_BYTES, more than MAX_SIGNATURES members,
    more than MAX_QUOTED quoted strings (components, key ids, nonces)."""
    return (
        len(inputs) > MAX_HEADER_BYTES
        or len(signatures) > MAX_HEADER_BYTES
        or signatures.count(",") >= MAX_SIGNATURES
        or inputs.count("=(") > MAX_SIGNATURES
        or inputs.count('"') > 2 * MAX_QUOTED
    )


def authority(host: str, scheme: str) -> str:
    """A Host as RFC 9421's ``@authority``: lower-case, without the scheme's default port or a trailing dot."""
    name, colon, port = host.strip().lower().rpartition(":")
    if not colon or "]" in port:
        name, port = host.strip().lower(), ""
    if port == {"https": "443", "http": "80"}.get(scheme):
        port = ""
    name = name.rstrip(".")
    return f"{name}:{port}" if port else name


def _fields(headers: Sequence[tuple[bytes, bytes]]) -> tuple[str, str, str, str]:
    """Signature-Input, Signature, Signature-Agent (each field's lines joined) and Host."""
    fields: dict[bytes, list[bytes]] = {b"signature-input": [], b"signature": [], b"signature-agent": [], b"host": []}
    for name, value in headers:
        lines = fields.get(name)
        if lines is not None:
            lines.append(value)
    inputs, signatures, agents, host = (b", ".join(lines).decode("latin-1") for lines in fields.values())
    return inputs, signatures, agents, host


def _params(member: object) -> dict[str, Any]:
    return member[1] if isinstance(member, tuple) and len(member) == 2 and isinstance(member[1], dict) else {}


def _agent_origin(agent: str, components: list[Any]) -> str | None:
    """The operator's origin from ``Signature-Agent``: a string (the first drafts) or a dictionary member, the
    one the signature covers by its ``key`` (the later ones)."""
    if not agent or len(agent) > MAX_HEADER_BYTES:
        return None
    value: object = None
    try:
        parsed = http_sf.parse(agent.encode("latin-1"), tltype="item")
        value = parsed[0] if isinstance(parsed, tuple) else None
    except (http_sf.StructuredFieldError, ValueError):
        try:
            members = http_sf.parse(agent.encode("latin-1"), tltype="dictionary")
        except (http_sf.StructuredFieldError, ValueError):
            return None
        assert isinstance(members, dict)
        key = next((p.get("key") for name, p in components if name == "signature-agent" and "key" in p), None)
        chosen = members.get(key) if key is not None else (next(iter(members.values())) if len(members) == 1 else None)
        value = chosen[0] if isinstance(chosen, tuple) else None
    if not isinstance(value, str):
        return None
    return origin_of(value.strip().removeprefix("<").removesuffix(">"))


def _invalid(reason: str) -> SignatureCheck:
    return SignatureCheck("invalid", "", reason)


def _remember(memory: OrderedDict[Any, float], key: Any, until: float) -> None:
    memory[key] = until
    memory.move_to_end(key)
    if len(memory) > REMEMBERED:
        memory.popitem(last=False)
