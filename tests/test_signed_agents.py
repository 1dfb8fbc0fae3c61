"""Web Bot Auth: requests an agent's operator signed (RFC 9421), verified against the operator's key directory,
served on a real loopback server; signatures made by http-message-signatures' own signer, not by our code."""

from __future__ import annotations

import asyncio
import base64
import datetime
import gzip
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from crawlergate.config import load_settings
from crawlergate.errors import ConfigError
from crawlergate.gate.request import Request as GateRequest
from crawlergate.suspect.agents import Operators, load_operators
from crawlergate.suspect.keydirectory import DIRECTORY_PATH, KeyDirectories, thumbprint
from crawlergate.suspect.signatures import SignatureCheck, SignedAgents
from crawlergate.wiring import build_core
from tests.conftest import ServerThread, serve_process
from tests.visitors import CHATGPT_AGENT_UA, FIREFOX, raw_headers

# The site's public URL: the authority every signature of these tests is made for.
PUBLIC = "https://forum.example"
COVERED = ("@authority", "@method", "@path", "signature-agent")


@dataclass
class Key:
    private: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)

    @property
    def x(self) -> str:
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()

    @property
    def keyid(self) -> str:
        return thumbprint(self.x)

    @property
    def jwk(self) -> dict[str, object]:
        return {"kty": "OKP", "crv": "Ed25519", "x": self.x, "kid": self.keyid, "use": "sig"}


@dataclass
class Directory:
    """What the operator's directory server answers: its keys, status, Cache-Control, a delay; and how often."""

    keys: list[Key]
    status: int = 200
    cache_control: str = "max-age=3600"
    delay_s: float = 0.0
    padding: int = 0
    # The test CA the directory's certificate is signed by (what verify.directory_ca_file names).
    ca_file: str = ""
    # What a broken or hostile directory sends instead: "deep" (JSON nested past Python's recursion limit),
    # "trickle" (a byte every 0.2 s), "gzip" (a small gzip of 8 MB).
    broken: str = ""
    fetched: int = 0


@dataclass
class _Message:
    method: str
    url: str
    headers: dict[str, str]


def sign(
    key: Key,
    url: str,
    agent: str,
    *,
    method: str = "GET",
    covered: tuple[str, ...] = COVERED,
    created: float | None = None,
    lifetime_s: float = 60,
    nonce: str | None = None,
    keyid: str | None = None,
    agent_header: str | None = None,
    more: dict[str, str] | None = None,
) -> dict[str, str]:
    """The headers of a request signed as an agent of ``agent`` (an origin) would sign it (``more``: other
    headers it sends, which ``covered`` may name)."""
    message = _Message(method, url, {"Signature-Agent": agent_header or f'"{agent}"', **(more or {})})
    keyid = keyid or key.keyid
    resolver = MappingKeyResolver(public_keys={}, private_keys={keyid: key.private})
    signer = HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=resolver)
    start = datetime.datetime.fromtimestamp(created if created is not None else time.time(), datetime.UTC)
    signer.sign(
        message,
        key_id=keyid,
        created=start,
        expires=start + datetime.timedelta(seconds=lifetime_s),
        nonce=nonce if nonce is not None else base64.b64encode(Ed25519PrivateKey.generate().sign(b"n")[:24]).decode(),
        tag="web-bot-auth",
        covered_component_ids=covered,
    )
    return message.headers


def raw(headers: dict[str, str], host: str) -> list[tuple[bytes, bytes]]:
    return [(b"host", host.encode())] + [(name.lower().encode(), value.encode()) for name, value in headers.items()]


@pytest.fixture(scope="module")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A test certificate authority and a certificate it signed for localhost: the CA file, the server's key and
    certificate (PEM)."""
    folder = tmp_path_factory.mktemp("ca")
    now = datetime.datetime.now(datetime.UTC)

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None, signer: Any) -> Any:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        builder = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
        )
        if issuer is None:
            builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            builder = builder.add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )
        else:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = certificate("crawlergate test CA", ca_key, None, ca_key)
    server = certificate("localhost", server_key, ca.subject, ca_key)
    paths = folder / "ca.pem", folder / "server-key.pem", folder / "server.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    paths[2].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    return paths


@pytest.fixture
def directory(test_ca: tuple[Path, Path, Path]) -> Iterator[tuple[Directory, str]]:
    """An operator's key directory on a loopback HTTPS server with the test CA's certificate; its origin."""
    served = Directory([Key()], ca_file=str(test_ca[0]))

    async def keys(request: Request) -> Response:
        served.fetched += 1
        if served.delay_s:
            await asyncio.sleep(served.delay_s)
        if served.broken == "deep":
            return Response("[" * 60_000, media_type="application/json")
        if served.broken == "gzip":
            bomb = gzip.compress(b" " * (8 << 20))
            return Response(bomb, headers={"content-encoding": "gzip"}, media_type="application/json")
        if served.broken == "trickle":

            async def trickle() -> Any:
                for _ in range(100):
                    await asyncio.sleep(0.2)
                    yield b" "

            return StreamingResponse(trickle(), media_type="application/json")
        body = json.dumps({"keys": [key.jwk for key in served.keys], "padding": "x" * served.padding})
        headers = {"cache-control": served.cache_control}
        return Response(body, served.status, headers, media_type="application/http-message-signatures-directory+json")

    app = Starlette(routes=[Route(DIRECTORY_PATH, keys)])
    server = ServerThread(app, ssl_keyfile=str(test_ca[1]), ssl_certfile=str(test_ca[2])).start()
    yield served, f"https://localhost:{server.port}"
    server.server.force_exit = True  # a hanging answer is not waited for
    server.stop()


def _agents(served: Directory, origin: str, *, trust_s: float = 0.0, timeout_s: float = 2.0) -> SignedAgents:
    directories = KeyDirectories(timeout_s=timeout_s, max_bytes=4096, min_s=1, max_s=3600, ca_file=served.ca_file)
    return SignedAgents(Operators({origin: "Test agent"}), directories, skew_s=5, trust_s=trust_s, public_url=PUBLIC)


def _wait_for_keys(agents: SignedAgents, origin: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while agents.directories.keys(origin) is None:
        assert time.monotonic() < deadline, "the key directory was never fetched"
        time.sleep(0.02)


def _check(agents: SignedAgents, headers: dict[str, str], *, path: bytes = b"/t/1", **options: Any) -> SignatureCheck:
    host = options.pop("host", "forum.example")
    client = options.pop("client", "192.0.2.7")
    found = agents.check("GET", path, raw(headers, host), client)
    assert found is not None
    return found


def test_signed_agent_is_pending_until_its_directory_is_fetched_then_verified(
    directory: tuple[Directory, str],
) -> None:
    served, origin = directory
    agents = _agents(served, origin)
    assert _check(agents, sign(served.keys[0], "https://forum.example/t/1", origin)).outcome == "pending"
    _wait_for_keys(agents, origin)
    assert _check(agents, sign(served.keys[0], "https://forum.example/t/1", origin)) == SignatureCheck(
        "verified", "Test agent"
    )
    assert served.fetched == 1  # fresh for its max-age: not fetched again
    agents.directories.close()


def test_signed_agent_failures_are_unverified_claims_each_with_its_reason(directory: tuple[Directory, str]) -> None:
    served, origin = directory
    agents = _agents(served, origin)
    agents.directories.keys(origin)
    _wait_for_keys(agents, origin)
    key, url = served.keys[0], "https://forum.example/t/1"
    replayed = sign(key, url, origin, nonce="once")
    assert _check(agents, replayed).outcome == "verified"
    unlisted = origin.replace("localhost", "127.0.0.1")  # the same server under an origin the list does not name
    fetched = served.fetched
    cases = [
        ("expired", sign(key, url, origin, created=time.time() - 600)),
        ("malformed", sign(key, url, origin, created=time.time() + 600)),
        ("replayed", replayed),
        ("bad-signature", sign(Key(), url, origin, keyid=key.keyid)),  # another key under the published key's id
        ("unknown-key", sign(Key(), url, origin)),
        ("uncovered", sign(key, url, origin, covered=("@authority", "@path"))),
        ("unknown-operator", sign(key, url, unlisted)),
        ("no-agent", {**sign(key, url, origin), "Signature-Agent": "not a string"}),
        ("bad-signature", {  # a signed header tampered with
            **sign(key, url, origin, covered=(*COVERED, "user-agent"), more={"User-Agent": "Agent/1"}),
            "User-Agent": "Agent/2",
        }),
        ("bad-signature", sign(key, "https://www.forum.example/t/1", origin)),  # signed for another @authority
    ]  # fmt: skip
    for reason, headers in cases:
        operator = "" if reason in ("unknown-operator", "no-agent") else "Test agent"
        assert _check(agents, headers) == SignatureCheck("invalid", operator, reason)
    assert served.fetched == fetched  # an origin outside the list is never fetched
    # Signed for one page, sent for another; signed for another site than this one's public host.
    assert _check(agents, sign(key, url, origin), path=b"/t/2").reason == "bad-signature"
    signed_elsewhere = sign(key, "https://elsewhere.example/t/1", origin)
    assert _check(agents, signed_elsewhere, host="elsewhere.example").reason == "authority"
    # The default port of the public scheme is no other authority (RFC 9421 drops it too).
    assert _check(agents, sign(key, url, origin), host="forum.example:443").outcome == "verified"
    long_nonce = sign(key, url, origin, nonce="n" * 300)
    assert _check(agents, long_nonce).reason == "malformed"
    many = sign(key, url, origin)
    many["Signature-Input"] += "".join(f', s{n}=("@authority");created=1;keyid="k"' for n in range(5))
    assert _check(agents, many).reason == "malformed"  # more signatures than an agent sends: not parsed further
    labels = {**sign(key, url, origin)}
    labels["Signature"] += "".join(f", s{n}=:AA==:" for n in range(5))
    components = {**sign(key, url, origin)}
    components["Signature-Input"] = components["Signature-Input"].replace("(", "(" + '"a" ' * 40, 1)
    assert _check(agents, labels).reason == _check(agents, components).reason == "malformed"
    backwards = sign(key, url, origin, created=time.time(), lifetime_s=-30)
    assert _check(agents, backwards).reason == "malformed"  # expires before it was created
    # A request target that is no path (an h11 server passes "@evil.example/x" on): the URL checked is the
    # public authority's, so the library never reads another authority out of it.
    assert _check(agents, sign(key, "https://evil.example/x", origin), path=b"@evil.example/x").reason == "malformed"
    unsigned = {"Signature-Input": 'sig1=("@authority");created=1;keyid="k";tag="other"', "Signature": "sig1=:AA==:"}
    assert agents.check("GET", b"/t/1", raw(unsigned, "forum.example"), None) is None
    agents.directories.close()


def test_signed_agent_named_in_a_signature_agent_dictionary(directory: tuple[Directory, str]) -> None:
    served, origin = directory
    agents = _agents(served, origin)
    agents.directories.keys(origin)
    _wait_for_keys(agents, origin)
    covered = ("@authority", '"signature-agent";key="agent2"')
    headers = sign(
        served.keys[0], "https://forum.example/t/1", origin, covered=covered,
        agent_header=f'agent1="https://other.example", agent2="{origin}"',
    )  # fmt: skip
    assert _check(agents, headers) == SignatureCheck("verified", "Test agent")
    agents.directories.close()


def test_signed_agent_trusted_for_a_while_by_key_and_address_only(directory: tuple[Directory, str]) -> None:
    served, origin = directory
    url = "https://forum.example/t/1"
    for trust_s, expected in ((0.0, "bad-signature"), (30.0, "")):
        agents = _agents(served, origin, trust_s=trust_s)
        agents.directories.keys(origin)
        _wait_for_keys(agents, origin)
        assert _check(agents, sign(served.keys[0], url, origin)).outcome == "verified"
        assert _check(agents, _forged(served.keys[0], url, origin)).reason == expected
        other = _check(agents, _forged(served.keys[0], url, origin), client="198.51.100.1")
        assert other.reason == "bad-signature"  # another address is checked in full
        agents.directories.close()


def _forged(key: Key, url: str, origin: str) -> dict[str, str]:
    """A fresh signature's headers with its bytes replaced."""
    return {**sign(key, url, origin), "Signature": "pyhms=:" + base64.b64encode(b"x" * 64).decode() + ":"}


def test_key_directory_fetches_are_bounded_and_a_failure_keeps_the_keys_it_had(
    directory: tuple[Directory, str],
) -> None:
    served, origin = directory
    directories = KeyDirectories(timeout_s=0.5, max_bytes=65536, min_s=1, max_s=2, ca_file=served.ca_file)
    served.cache_control = "max-age=99999"
    directories.fetch(origin)  # what the thread does, here in the test's own
    keys = directories.keys(origin)
    assert keys is not None and list(keys) == [served.keys[0].keyid]
    assert directories.status()["directories"][origin]["fresh_s"] <= 2  # type: ignore[index]
    for broken in (
        {"padding": 100_000},
        {"status": 500},
        {"delay_s": 2.0},
        {"broken": "deep"},
        {"broken": "gzip"},
        {"broken": "trickle"},
    ):
        for name, value in broken.items():
            setattr(served, name, value)
        failures = directories.failures
        started = time.monotonic()
        directories.fetch(origin)
        assert directories.failures == failures + 1 and time.monotonic() - started < 2, broken
        assert directories._directories[origin].keys == keys  # the keys it had, until the directory answers again
        served.padding, served.status, served.delay_s, served.broken = 0, 200, 0.0, ""
    directories.close()


def _dripping_server(lines: list[bytes]) -> tuple[socket.socket, threading.Event]:
    """A loopback server that answers every connection by sending ``lines`` a byte (or a line) every 0.05 s, for
    five seconds at most: what no client timeout per read catches."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                connection.recv(65536)
                deadline = time.monotonic() + 5
                for piece in lines:
                    if done.is_set() or time.monotonic() > deadline:
                        break
                    try:
                        connection.sendall(piece)
                    except OSError:
                        break
                    time.sleep(0.05)

    threading.Thread(target=serve, daemon=True).start()
    return listener, done


def test_key_directory_fetch_has_one_deadline_for_head_and_informational_answers() -> None:
    head = [bytes([byte]) for byte in b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n"]
    informational = [b"HTTP/1.1 102 Processing\r\n\r\n"] * 100
    for lines in (head, informational):
        listener, done = _dripping_server(lines)
        origin = f"http://127.0.0.1:{listener.getsockname()[1]}"
        directories = KeyDirectories(timeout_s=0.5, max_bytes=4096, min_s=1, max_s=2)
        started = time.monotonic()
        directories.fetch(origin)
        assert directories.failures == 1 and time.monotonic() - started < 2  # the deadline, not the 5 s drip
        done.set()
        listener.close()


def test_operators_file_refuses_origins_a_client_could_abuse(tmp_path: Path) -> None:
    path = tmp_path / "agents.toml"
    for origin in ("http://agent.example", "https://agent.example/keys", "ftp://agent.example", "https://"):
        path.write_text(f'[[operator]]\nname = "Agent"\norigin = "{origin}"\n')
        with pytest.raises(ConfigError, match="must be https://host"):
            load_operators(path)
    path.write_text('[[operator]]\nname = "Agent"\norigin = "https://Agent.example:8443"\n')
    assert load_operators(path).by_origin == {"https://agent.example:8443": "Agent"}
    assert load_operators(Path(__file__).parents[1] / "rules" / "agents.toml").name_of("https://chatgpt.com")


@pytest.mark.e2e
def test_serve_gives_a_verified_agent_its_policy_and_counts_it(
    directory: tuple[Directory, str], tmp_path: Path
) -> None:
    from crawlergate.demo.forum import create_forum

    served, origin = directory
    forum = ServerThread(create_forum(tmp_path / "forum.sqlite3", threads=8, work_ms=1)).start()
    agents_file = tmp_path / "agents.toml"
    agents_file.write_text(f'[[operator]]\nname = "Test agent"\norigin = "{origin}"\n')
    config = f'[server]\npublic_url = "https://forum.example"\n[verify]\nagents_file = "{agents_file}"\n'
    config += f'directory_ca_file = "{served.ca_file}"\n'
    config += "[regenerate]\nenabled = false\n"
    # The site's public name, as a TLS proxy in front would pass it on; the agent signs for it.
    browser = {**FIREFOX, "user-agent": CHATGPT_AGENT_UA, "host": "forum.example"}
    signed_for = "https://forum.example/showthread.php?t=3"
    try:
        with serve_process(forum.url, tmp_path / "gate", config) as base:
            url = f"{base}/showthread.php?t=3"
            deadline = time.monotonic() + 20
            while True:  # the first signed requests are judged without the keys while they are fetched
                answer = httpx.get(url, headers={**browser, **sign(served.keys[0], signed_for, origin)})
                if answer.headers["x-crawlergate"] != "pass" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert answer.headers["x-crawlergate"] in ("miss", "l1-hit")  # the policy's default: cached pages
            again = httpx.get(url, headers={**browser, **sign(served.keys[0], signed_for, origin)})
            assert again.headers["x-crawlergate"] == "l1-hit"
            forged = {
                **sign(served.keys[0], signed_for, origin),
                "Signature-Input": sign(Key(), signed_for, origin)["Signature-Input"],
            }
            suspect = httpx.get(url, headers={**browser, **forged})
            assert suspect.headers["x-crawlergate"] == "l1-hit"  # an unverified claimant: a suspect, from the cache
            assert httpx.get(url, headers=browser).headers["x-crawlergate"] == "pass"  # the same browser unsigned
            stats = httpx.get(f"{base}/_crawlergate/stats").json()
            assert stats["signed_agents"]["verified"] >= 2 and stats["signed_agents"]["unverified"] == 1
            assert stats["signed_agents"]["operators"]["Test agent"] >= 2
            assert stats["families"]["Test agent"]["tag"] == "signed-agent"
            metrics = httpx.get(f"{base}/_crawlergate/metrics").text
            assert 'crawlergate_signed_agents_total{operator="Test agent"}' in metrics
        policy = tmp_path / "policy.toml"
        policy.write_text('[family]\n"Test agent" = "live"\n')
        with serve_process(forum.url, tmp_path / "live", config + f'[policy]\nrules_file = "{policy}"\n') as base:
            url = f"{base}/showthread.php?t=3"
            deadline = time.monotonic() + 20
            while True:
                answer = httpx.get(url, headers={**browser, **sign(served.keys[0], signed_for, origin)})
                stats = httpx.get(f"{base}/_crawlergate/stats").json()
                if stats["signed_agents"]["verified"] or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert answer.headers["x-crawlergate"] == "pass" and stats["signed_agents"]["verified"] == 1
    finally:
        forum.stop()


def test_directory_fetch_never_holds_a_request(directory: tuple[Directory, str]) -> None:
    served, origin = directory
    served.delay_s = 1.5
    agents = _agents(served, origin)
    started = time.monotonic()
    results = [_check(agents, sign(served.keys[0], "https://forum.example/t/1", origin)) for _ in range(20)]
    assert time.monotonic() - started < 1.0 and {result.outcome for result in results} == {"pending"}
    assert threading.active_count() >= 2
    _wait_for_keys(agents, origin)
    assert served.fetched == 1  # one fetch under way at a time, however many requests asked
    agents.directories.close()


def test_signatures_are_not_believed_without_the_sites_public_url(
    directory: tuple[Directory, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Without server.public_url nothing says which authority a signature must name: one an agent made for
    another site would verify here. The request is judged as if unsigned, and the operator is told once."""
    served, origin = directory
    agents_file = tmp_path / "agents.toml"
    agents_file.write_text(f'[[operator]]\nname = "Test agent"\norigin = "{origin}"\n')
    browser = raw_headers({**FIREFOX, "user-agent": CHATGPT_AGENT_UA})
    for public_url, expected in (("", "human"), ("https://forum.example", "suspect")):
        overrides = {
            "l2.cache_dir": str(tmp_path / "l2"),
            "verify.agents_file": str(agents_file),
            "verify.directory_ca_file": served.ca_file,
        }
        core = build_core(load_settings(environ={}, overrides={**overrides, "server.public_url": public_url}))
        signed = raw(sign(served.keys[0], "https://elsewhere.example/t/1", origin), "elsewhere.example")
        request = GateRequest("GET", "/t/1", b"/t/1", b"", [*browser, *signed], "192.0.2.7", "https")
        assert core.judge.signed is not None
        core.judge.signed.directories.keys(origin)
        _wait_for_keys(core.judge.signed, origin)
        for _ in range(2):
            assert core.decide(request).verdict.kind == expected  # a person; a suspect for another authority
        core.close()
    assert caplog.text.count("server.public_url is not set") == 1


def test_operator_named_like_a_crawler_family_is_refused(tmp_path: Path) -> None:
    agents_file = tmp_path / "agents.toml"
    overrides = {"l2.cache_dir": str(tmp_path), "verify.agents_file": str(agents_file)}
    for name in ("Googlebot", "hidden", "unknown"):  # a crawler family, the suspects', the unnamed crawlers'
        agents_file.write_text(f'[[operator]]\nname = "{name}"\norigin = "https://agent.example"\n')
        with pytest.raises(ConfigError, match=f"{name}: already a crawler family"):
            build_core(load_settings(environ={}, overrides=overrides))


@pytest.mark.e2e
def test_serve_a_directory_that_hangs_holds_no_signed_request(directory: tuple[Directory, str], tmp_path: Path) -> None:
    """The operator's directory answers after 30 s (the gate gives up at 5): signed requests meanwhile are
    judged as if unsigned, at once, like their unsigned neighbours; the directory is asked once."""
    from crawlergate.demo.forum import create_forum

    served, origin = directory
    served.delay_s = 30.0
    forum = ServerThread(create_forum(tmp_path / "forum.sqlite3", threads=8, work_ms=1)).start()
    agents_file = tmp_path / "agents.toml"
    agents_file.write_text(f'[[operator]]\nname = "Test agent"\norigin = "{origin}"\n')
    config = f'[server]\npublic_url = "https://forum.example"\n[verify]\nagents_file = "{agents_file}"\n'
    config += f'directory_ca_file = "{served.ca_file}"\n[regenerate]\nenabled = false\n'
    browser = {**FIREFOX, "user-agent": CHATGPT_AGENT_UA, "host": "forum.example"}
    took: dict[str, list[float]] = {"signed": [], "unsigned": []}
    try:
        with serve_process(forum.url, tmp_path / "gate", config) as base, httpx.Client() as client:
            url = f"{base}/showthread.php?t=4"
            for _ in range(60):
                signed = {**browser, **sign(served.keys[0], "https://forum.example/showthread.php?t=4", origin)}
                for kind, headers in (("signed", signed), ("unsigned", browser)):
                    started = time.perf_counter()
                    answer = client.get(url, headers=headers)
                    took[kind].append(time.perf_counter() - started)
                    assert answer.status_code == 200 and answer.headers["x-crawlergate"] == "pass"
            pending = client.get(f"{base}/_crawlergate/stats").json()["signed_agents"]["pending"]
    finally:
        forum.stop()
    assert pending == 60 and served.fetched == 1
    p99 = {kind: sorted(times)[int(len(times) * 0.99) - 1] for kind, times in took.items()}
    assert p99["signed"] < p99["unsigned"] + 0.5, p99  # a request that waited would take the 5 s timeout


def test_a_key_the_directory_did_not_publish_has_it_fetched_again_once_a_minute(
    directory: tuple[Directory, str],
) -> None:
    """An operator rotating its keys: a signature with the new key, a minute after the directory was read, has
    it read again (judged as unsigned meanwhile); made-up key ids cannot make the gate fetch more often."""
    served, origin = directory
    now = [1_000_000.0]
    directories = KeyDirectories(timeout_s=2, max_bytes=4096, min_s=3600, max_s=3600, ca_file=served.ca_file,
                                 clock=lambda: now[0])  # fmt: skip
    agents = SignedAgents(Operators({origin: "Test agent"}), directories, skew_s=5, trust_s=0, public_url=PUBLIC)
    directories.fetch(origin)
    url, rotated = "https://forum.example/t/1", Key()
    served.keys.append(rotated)
    assert _check(agents, sign(rotated, url, origin)).reason == "unknown-key"  # read a moment ago: not again
    now[0] += 61
    assert _check(agents, sign(rotated, url, origin)).outcome == "pending"
    deadline = time.monotonic() + 10
    while rotated.keyid not in (directories.keys(origin) or {}):
        assert time.monotonic() < deadline, "the directory was not read again"
        time.sleep(0.02)
    assert _check(agents, sign(rotated, url, origin)).outcome == "verified"
    assert _check(agents, sign(Key(), url, origin)).reason == "unknown-key" and served.fetched == 2
    directories.close()
