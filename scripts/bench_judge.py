"""What judging a request costs: the gate's decision with the judge at work against the judge idle.

In one process, GateCore.decide (routing, classification, evidence, verification, policy: everything
before the cache is asked) is timed for the requests the gate sees, with the shipped rules (judged)
and with no evidence, no search-engine ranges and no signature checks (idle: the decision as it was
before issue 16). The signed agent's requests carry a Web Bot Auth signature (signed by
http-message-signatures, its key directory served on a loopback port): checked in full on every
request (verify.signature_trust_seconds = 0, the default), and from an address trusted for 30 s.
Rounds alternate the two gates; medians of the rounds are reported, in µs a decision. Then the
behaviour sketch: its bytes, fixed at start, before and after a million distinct addresses, and the
time of one page observed.

    python scripts/bench_judge.py [--rounds 7] [--requests 200000]
"""

from __future__ import annotations

import argparse
import base64
import datetime
import http.server
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchlib import CHROME, FIREFOX, GOOGLEBOT
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from http_message_signatures import HTTPMessageSigner, MappingKeyResolver, algorithms

from crawlergate.config import load_settings
from crawlergate.gate.engine import GateCore
from crawlergate.gate.request import Request
from crawlergate.suspect.keydirectory import DIRECTORY_PATH, thumbprint
from crawlergate.suspect.sketch import BehaviourSketch
from crawlergate.wiring import build_core

NAVIGATION = [
    (b"accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"accept-language", b"en-US,en;q=0.5"),
    (b"accept-encoding", b"gzip, deflate, br, zstd"),
    (b"sec-fetch-mode", b"navigate"),
    (b"sec-fetch-dest", b"document"),
]
HOST = [(b"host", b"forum.example")]
PEOPLE = "people's Firefox (forwarded)"
CASES = {
    "Googlebot, from this machine": [*HOST, (b"user-agent", GOOGLEBOT.encode()), (b"accept-encoding", b"gzip")],
    "Googlebot, from Google (forwarded)": [
        *HOST,
        (b"user-agent", GOOGLEBOT.encode()),
        (b"accept-encoding", b"gzip"),
        (b"x-forwarded-for", b"66.249.66.1"),
    ],
    "curl as Chrome (forwarded): suspect": [
        *HOST,
        (b"user-agent", CHROME.encode()),
        (b"accept", b"*/*"),
        (b"x-forwarded-for", b"203.0.113.9"),
    ],
    PEOPLE: [
        *HOST,
        (b"user-agent", FIREFOX.encode()),
        *NAVIGATION,
        (b"x-forwarded-for", b"198.51.100.4"),
    ],
}


SIGNED = "signed agent, every signature checked"
TRUSTED = "signed agent, trusted address (30 s)"


class SigningAgent:
    """An agent operator: an Ed25519 key, its directory on a loopback port, and requests signed with it."""

    def __init__(self) -> None:
        self.key = Ed25519PrivateKey.generate()
        raw = self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        x = base64.urlsafe_b64encode(raw).rstrip(b"=").decode()
        self.keyid = thumbprint(x)
        body = json.dumps({"keys": [{"kty": "OKP", "crv": "Ed25519", "x": x}]}).encode()

        class Directory(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200 if self.path == DIRECTORY_PATH else 404)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Directory)
        self.origin = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def headers(self) -> list[tuple[bytes, bytes]]:
        """A page load of ChatGPT agent's kind: a browser's headers, signed (without a nonce: sent again and again)."""

        class Message:
            method = "GET"
            url = "https://forum.example/showthread.php?t=7"
            headers = {"Signature-Agent": f'"{self.origin}"'}

        now = datetime.datetime.now(datetime.UTC)
        resolver = MappingKeyResolver(public_keys={}, private_keys={self.keyid: self.key})
        HTTPMessageSigner(signature_algorithm=algorithms.ED25519, key_resolver=resolver).sign(
            Message, key_id=self.keyid, created=now, expires=now + datetime.timedelta(hours=1), tag="web-bot-auth",
            covered_component_ids=("@authority", "@method", "@path", "signature-agent"),
        )  # fmt: skip
        signed = [(name.lower().encode(), value.encode()) for name, value in Message.headers.items()]
        return [*HOST, (b"user-agent", CHROME.encode()), *NAVIGATION, *signed, (b"x-forwarded-for", b"192.0.2.7")]


def gate(cache_dir: Path, judged: bool, agent: SigningAgent, trust_s: float = 30.0) -> GateCore:
    cache_dir.mkdir(parents=True, exist_ok=True)
    agents = cache_dir / "agents.toml"
    agents.write_text(f'[[operator]]\nname = "Bench agent"\norigin = "{agent.origin}"\n')
    overrides: dict[str, object] = {
        "l2.cache_dir": str(cache_dir),
        "verify.agents_file": str(agents),
        "verify.signature_trust_seconds": trust_s,
        "server.public_url": "https://forum.example",
        "server.trusted_proxies": ["127.0.0.1"],
    }
    if not judged:
        no_ranges = cache_dir / "no-ranges.toml"
        no_ranges.write_text("")
        overrides |= {"evidence.enabled": False, "verify.ranges_file": str(no_ranges), "verify.signatures": False}
    core = build_core(load_settings(environ={}, overrides=overrides))
    core.start()
    signed = core.judge.signed
    if signed is not None:
        deadline = time.monotonic() + 10
        while signed.directories.keys(agent.origin) is None and time.monotonic() < deadline:
            time.sleep(0.01)
    return core


def time_decisions(core: GateCore, headers: list[tuple[bytes, bytes]], requests: int) -> float:
    """µs a decision, over ``requests`` decisions of one page (a person's from 4,096 addresses, each reading a few
    pages: one address alone at this rate would be a suspect)."""
    decide = core.decide
    if headers is CASES[PEOPLE]:
        variants = [[*headers[:-1], (b"x-forwarded-for", b"198.51.%d.%d" % divmod(n, 256))] for n in range(4096)]
    else:
        variants = [headers]
    asked = [
        Request("GET", "/showthread.php", b"/showthread.php", b"t=7", variant, "127.0.0.1", "https")
        for variant in variants
    ]
    count = len(asked)
    started = time.perf_counter()
    for number in range(requests):
        decide(asked[number % count])
    return (time.perf_counter() - started) * 1e6 / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--addresses", type=int, default=1_000_000)
    args = parser.parse_args()
    agent = SigningAgent()
    CASES[SIGNED] = CASES[TRUSTED] = agent.headers()
    with tempfile.TemporaryDirectory() as folder:
        gates = {
            "judged": gate(Path(folder) / "judged", True, agent),
            "idle": gate(Path(folder) / "idle", False, agent),
        }
        untrusting = gate(Path(folder) / "untrusting", True, agent, trust_s=0.0)
        results: dict[tuple[str, str], list[float]] = {}
        for round_number in range(args.rounds):
            for case, headers in CASES.items():
                for name, core in gates.items():
                    judging = untrusting if case == SIGNED and name == "judged" else core
                    # A signature checked in full costs some hundred µs: fewer of them keep the round short.
                    requests = args.requests // 20 if judging is untrusting else args.requests
                    results.setdefault((case, name), []).append(time_decisions(judging, headers, requests))
            print(f"round {round_number + 1}/{args.rounds} done", file=sys.stderr)
        for core in (*gates.values(), untrusting):
            verdict = core.decide(
                Request("GET", "/showthread.php", b"/showthread.php", b"t=7", CASES[SIGNED], "127.0.0.1")
            )
            judged = verdict.verdict
            assert core is gates["idle"] or judged.tag == "signed-agent", f"the signed agent was judged {judged}"
            core.close()
        agent.server.shutdown()
    print(f"\nGateCore.decide, {args.requests:,} decisions x {args.rounds} rounds, medians (µs a decision)")
    print(f"{'request':<38}{'judge idle':>12}{'judged':>10}{'added':>10}")
    for case in CASES:
        idle = statistics.median(results[(case, "idle")])
        judged = statistics.median(results[(case, "judged")])
        print(f"{case:<38}{idle:>12.2f}{judged:>10.2f}{judged - idle:>+10.2f}")

    sketch = BehaviourSketch(8 * 1024 * 1024, half_life_s=60)
    before = sketch.nbytes
    now = time.time()
    started = time.perf_counter()
    for number in range(args.addresses):
        address = f"10.{number >> 16 & 255}.{number >> 8 & 255}.{number & 255}"
        sketch.observe_page(address, referer=False, deep=True, cookie=False, now=now + number / 10_000)
    elapsed = time.perf_counter() - started
    print(
        f"\nbehaviour sketch (evidence.sketch_bytes 8 MiB): {before:,} bytes at start, {sketch.nbytes:,} after "
        f"{args.addresses:,} distinct addresses; {elapsed * 1e6 / args.addresses:.2f} µs a page observed "
        "(address and network)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
