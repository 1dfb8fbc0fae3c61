"""One verdict and one action per request: who claims what, what the evidence says, what the policy gives.

The user-agent classifier has spoken first. A session (cookie or credentials) is a person and
never judged. A request its agent's operator signed (Web Bot Auth, ``signatures.py``) is that
operator's verified agent when the signature holds, and an unverified claimant when it does not.
A crawler whose family publishes its addresses is verified against them; a claimant from
elsewhere is a suspect ("unverified claimant"). A request the user agent calls
human, for a page the cache could serve, is weighed: its own headers (``evidence.py``) and its
address's and network's recent behaviour (``sketch.py``); at the threshold it is a suspect
(family ``hidden``). The policy table then gives the action.

    judge = Judge.from_settings(settings, metrics, families)
    judgement = judge.signed_agent("GET", b"/t/1", headers, client)  # None: no signature to go by
    judgement = judge.claimant(verdict, client)           # a crawler by its user agent
    judgement = judge.visitor(user_agent, headers, client, scheme="https", proxied=False, deep=True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from crawlergate.classify import HUMAN, UNKNOWN_FAMILY, Verdict
from crawlergate.config import Settings
from crawlergate.errors import ConfigError
from crawlergate.metrics import SIGNED_AGENT, Metrics
from crawlergate.rules import default_rules_dir
from crawlergate.suspect.agents import load_operators
from crawlergate.suspect.evidence import EvidenceRules, browser_claim, load_evidence_rules
from crawlergate.suspect.keydirectory import KeyDirectories
from crawlergate.suspect.policy import Action, Policy, load_policy
from crawlergate.suspect.ranges import CrawlerRanges, default_ranges_file, load_ranges
from crawlergate.suspect.rdns import ReverseDns
from crawlergate.suspect.signatures import SignedAgents
from crawlergate.suspect.sketch import BehaviourSketch

SUSPECT_BY_EVIDENCE = Verdict("suspect", "hidden", "evidence")
UNVERIFIED_CLAIMANT = Verdict("suspect", "hidden", "unverified-claimant")
# Sec-Fetch-Dest of the requests a page load makes for its parts.
_ASSET_DESTINATIONS = frozenset((b"style", b"script", b"image", b"font", b"audio", b"video", b"track", b"manifest"))


@dataclass(frozen=True, slots=True)
class Judgement:
    """The verdict, the action the policy gives it, and the evidence (rule names) that made it."""

    verdict: Verdict
    action: Action
    reasons: tuple[str, ...] = ()


PERSON = Judgement(HUMAN, Action.LIVE)
_UNVERIFIED = ("claimants|unverified",)
# A browser names itself in its first few hundred characters; memoised header sets stay under a kilobyte or so.
_CLAIM_CHARS = 512
_REMEMBERED_BYTES = 1024


class Judge:
    """Evidence, verification and policy for one gate process.

    Parameters:
        policy: the policy table.
        metrics: where suspects, reasons and claimants are counted.
        rules: the evidence rules; None turns suspicion by evidence off.
        sketch: the behaviour sketch (with ``rules``).
        ranges: the published crawler addresses; None verifies nobody.
        dns: reverse DNS verification, or None.
        signed: Web Bot Auth verification of signed requests, or None.
        clock: seconds, for the behaviour counts' decay.
    """

    def __init__(
        self,
        policy: Policy,
        metrics: Metrics,
        *,
        rules: EvidenceRules | None = None,
        sketch: BehaviourSketch | None = None,
        ranges: CrawlerRanges | None = None,
        dns: ReverseDns | None = None,
        signed: SignedAgents | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.metrics = metrics
        self.rules = rules
        self.sketch = sketch
        self.ranges = ranges
        self.dns = dns
        self.signed = signed
        self._agents: dict[str, Verdict] = {}
        self._clock = clock  # behaviour decays in real time, whatever clock the gate's pages age by
        self._headers = rules.headers if rules is not None else frozenset()
        self._address_rules = tuple(rule for rule in rules.behaviours if rule.scope == "address") if rules else ()
        self._network_rules = tuple(rule for rule in rules.behaviours if rule.scope == "network") if rules else ()
        self._judgements: dict[tuple[Verdict, tuple[str, ...]], Judgement] = {}
        self._checked: dict[tuple[object, ...], tuple[float, tuple[str, ...]]] = {}
        self._plain: dict[int, Judgement] = {}

    @classmethod
    def from_settings(cls, settings: Settings, metrics: Metrics, families: Iterable[str] = ()) -> Judge:
        """The judge the settings describe; raises ConfigError for a broken rules, policy or ranges file."""
        rules_dir = Path(settings.classify.rules_dir) if settings.classify.rules_dir else default_rules_dir()
        verify = settings.verify
        signed = None
        if verify.signatures:
            operators = load_operators(_in_rules(rules_dir, verify.agents_file or "agents.toml"))
            directories = KeyDirectories(
                timeout_s=verify.directory_timeout_seconds,
                max_bytes=verify.directory_max_bytes,
                min_s=verify.directory_min_seconds,
                max_s=verify.directory_max_seconds,
                ca_file=verify.directory_ca_file,
            )
            trust_s = verify.signature_trust_seconds
            skew_s, public_url = verify.signature_skew_seconds, settings.server.public_url
            signed = SignedAgents(operators, directories, skew_s=skew_s, trust_s=trust_s, public_url=public_url)
        families = frozenset(families)
        # An operator's name is its agents' family: one a crawler family or the suspects' own already has would
        # hand that family's policy entry to whoever signs (or fails to sign) as the operator.
        taken = families | {SUSPECT_BY_EVIDENCE.family, UNKNOWN_FAMILY}
        if signed is not None and taken & signed.operators.names:
            clash = ", ".join(sorted(taken & signed.operators.names))
            raise ConfigError(f"{verify.agents_file or 'agents.toml'}: {clash}: already a crawler family's name.")
        named = families | signed.operators.names if signed is not None and families else families
        policy = load_policy(_in_rules(rules_dir, settings.policy.rules_file), named)
        rules = sketch = None
        if settings.evidence.enabled:
            rules = load_evidence_rules(_in_rules(rules_dir, settings.evidence.rules_file))
            sketch = BehaviourSketch(settings.evidence.sketch_bytes, settings.evidence.half_life_seconds)
        ranges_file = settings.verify.ranges_file
        ranges_path = _in_rules(rules_dir, ranges_file) if ranges_file else default_ranges_file()
        ranges = load_ranges(ranges_path)
        unknown = sorted(set(ranges.engines) - families) if families else []
        if unknown:
            raise ConfigError(f"{ranges_path}: {', '.join(unknown)}: no such crawler family in the rules.")
        dns = ReverseDns(cache_s=settings.verify.dns_cache_seconds) if settings.verify.reverse_dns else None
        return cls(policy, metrics, rules=rules, sketch=sketch, ranges=ranges, dns=dns, signed=signed)

    def judged(self, verdict: Verdict, reasons: tuple[str, ...] = ()) -> Judgement:
        if not reasons:
            # Verdicts are the classifier's shared objects: found by identity, without hashing their fields.
            known = self._plain.get(id(verdict))
            if known is not None and known.verdict is verdict:
                return known
            if len(self._plain) > 4096:
                self._plain.clear()
            known = self._plain[id(verdict)] = Judgement(verdict, self.policy.action_for(verdict))
            return known
        key = (verdict, reasons)
        judgement = self._judgements.get(key)
        if judgement is None:
            if len(self._judgements) > 4096:
                self._judgements.clear()
            judgement = self._judgements[key] = Judgement(verdict, self.policy.action_for(verdict), reasons)
        return judgement

    def needs_client(self, verdict: Verdict) -> bool:
        """Whether judging a crawler of ``verdict`` needs its address (its family publishes where it comes from)."""
        ranges = self.ranges
        return ranges is not None and ranges.verifiable(verdict.family, by_dns=self.dns is not None)

    def signed_agent(
        self, method: str, target: bytes, headers: Sequence[tuple[bytes, bytes]], client: str | None
    ) -> Judgement | None:
        """A request with a ``web-bot-auth`` signature: its operator's verified agent, or an unverified claimant
        when the signature fails; None when there is none, or its operator's keys are not known yet (judged
        without it meanwhile)."""
        signed = self.signed
        if signed is None:
            return None
        check = signed.check(method, target, headers, client)
        if check is None:
            return None
        if check.outcome == "pending":
            self.metrics.count("signatures|pending")
            return None
        if check.outcome == "invalid":
            self.metrics.count_all(("signatures|invalid", f"signature|{check.reason}", *_UNVERIFIED))
            return self.judged(UNVERIFIED_CLAIMANT, (f"signature-{check.reason}",))
        self.metrics.count("signatures|verified")
        verdict = self._agents.get(check.operator)
        if verdict is None:
            verdict = self._agents[check.operator] = Verdict("crawler", check.operator, SIGNED_AGENT)
        return self.judged(verdict)

    def claimant(self, verdict: Verdict, client: str | None) -> Judgement:
        """A crawler by its user agent: believed if its family's addresses (or reverse DNS) say so."""
        ranges = self.ranges
        if ranges is None:
            return self.judged(verdict)
        verified = ranges.verify(verdict.family, client)
        if not verified and self.dns is not None and client is not None:
            suffixes = ranges.dns_suffixes(verdict.family)
            if suffixes:
                verified = bool(self.dns.verified(client, suffixes))  # unknown yet: a suspect until it is
        if verified or verified is None:
            return self.judged(verdict)  # a verified one counts by its family (stats: verified_claimants)
        self.metrics.count_all(_UNVERIFIED)
        return self.judged(UNVERIFIED_CLAIMANT)

    def visitor(
        self,
        user_agent: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        client: str | None,
        *,
        scheme: str,
        proxied: bool,
        deep: bool,
    ) -> Judgement:
        """A page request the user agent calls human, without a session: a person, or a suspect on evidence.

        ``scheme`` is the connection's, ``proxied`` whether it came through a trusted proxy (whose
        X-Forwarded-Proto is believed), ``deep`` whether the page is other than the home page.
        """
        rules = self.rules
        if rules is None:
            return PERSON
        wanted = self._headers
        values = dict.fromkeys(wanted, b"")
        referer = cookie = False
        host = forwarded_proto = b""
        for name, value in headers:
            if name in wanted:
                values[name] = value
            if name == b"referer":
                referer = True
            elif name == b"cookie":
                cookie = True
            elif name == b"host":
                host = value
            elif name == b"x-forwarded-proto" and proxied:
                forwarded_proto = value
        secure = scheme == "https" or forwarded_proto.strip().lower() == b"https" or _is_loopback_host(host)
        # A client sends the same headers on every page: the checks of a set of them are worked out once (sets of
        # ordinary length: long ones are an attacker's, worked out each time so the memo stays small).
        seen = (user_agent, secure, *values.values())
        found = self._checked.get(seen)
        if found is None:
            claim = browser_claim(user_agent[:_CLAIM_CHARS].decode("latin-1")) if user_agent else None
            text = {name.decode(): value.decode("latin-1") for name, value in values.items()}
            found = rules.check_request(claim, text.__getitem__, secure=secure)
            if len(user_agent) + sum(map(len, values.values())) <= _REMEMBERED_BYTES:
                if len(self._checked) > 4096:
                    self._checked.clear()
                self._checked[seen] = found
        weight, reasons = found
        sketch = self.sketch
        now = self._clock()
        # Convicted by its own headers, a request needs no memory of its address: the sketch keeps to the others.
        if weight < rules.threshold and sketch is not None and client is not None and not _is_loopback(client):
            address_counts, network_counts = sketch.observe_page(
                client, referer=referer, deep=deep, cookie=cookie, now=now
            )
            site_assets = sketch.site_assets(now) >= 1.0
            scopes = ((self._address_rules, address_counts), (self._network_rules, network_counts))
            for rules_of_scope, counts in scopes:
                if counts is None:
                    continue
                for rule in rules_of_scope:
                    if rule.fires(counts, site_assets):
                        weight += rule.weight
                        reasons += (rule.name,)
        if weight < rules.threshold:
            return PERSON
        self.metrics.count_all(("suspects|evidence", *(f"evidence|{reason}" for reason in reasons)))
        return self.judged(SUSPECT_BY_EVIDENCE, reasons)

    def asset(self, headers: Sequence[tuple[bytes, bytes]], static: bool, client: str | None) -> None:
        """Note a request that is part of a page (a stylesheet, script, image or font) for its client."""
        if self.sketch is None or client is None or _is_loopback(client):
            return
        if not static:
            destination = next((value for name, value in headers if name == b"sec-fetch-dest"), b"")
            if destination not in _ASSET_DESTINATIONS:
                return
        self.sketch.observe_asset(client, self._clock())

    def cookie_offered(self, client: str | None) -> None:
        """The site's answer to ``client`` set a cookie (a browser sends it back; most scrapers do not)."""
        if self.sketch is not None and client is not None and not _is_loopback(client):
            self.sketch.observe_cookie_offered(client, self._clock())

    def verified_claimants(self, families: dict[str, dict[str, object]]) -> int:
        """Requests of crawlers whose family was checked and held (those that failed are suspects, not of it)."""
        ranges = self.ranges
        if ranges is None:
            return 0
        by_dns = self.dns is not None
        return sum(
            int(str(figures.get("requests", 0)))
            for family, figures in families.items()
            if ranges.verifiable(family, by_dns=by_dns)
        )

    def close(self) -> None:
        if self.signed is not None:
            self.signed.directories.close()

    def status(self) -> dict[str, object]:
        return {
            "enabled": self.rules is not None,
            "sketch_bytes": self.sketch.nbytes if self.sketch is not None else 0,
            "ranges_snapshot": self.ranges.snapshot if self.ranges is not None else "",
            "reverse_dns": self.dns is not None,
            "signatures": self.signed.directories.status() if self.signed is not None else None,
        }


def _in_rules(rules_dir: Path, name: str) -> Path:
    path = Path(name)
    return path if path.is_absolute() or path.exists() else rules_dir / name


def _is_loopback_host(host: bytes) -> bool:
    """Whether a Host header names this machine: a secure origin to browsers, even over plain http."""
    name = host.rpartition(b":")[0] if host.count(b":") == 1 else host
    return name.lower() in (b"localhost", b"[::1]") or name.startswith(b"127.")


def _is_loopback(client: str) -> bool:
    """This machine: a proxy in front that is not trusted to name its clients (server.trusted_proxies), or the
    operator's own tools. Its requests are everybody's, so behaviour over time says nothing about anyone."""
    return client.startswith(("127.", "::ffff:127.")) or client == "::1"
