"""What a person does on each site, with the checks every one of their answers must pass.

A ``Person`` is a browser (Chrome's user agent) keeping cookies in an httpx client. Redirects are
followed by hand so that each ``Location`` is checked before it is used: it must name the address
the person talks to (the gate), never the origin's port. Through the gate every answer must say
``X-Crawlergate: pass``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

import httpx

from tests.sites import trac_site
from tests.sites.django_site import seed as django_seed
from tests.visitors import CHROME, GOOGLEBOT

UPLOAD_BYTES = 5 * 1024 * 1024


@dataclass
class Visit:
    method: str
    url: str
    status: int
    outcome: str
    location: str

    def __str__(self) -> str:
        where = f" -> {self.location}" if self.location else ""
        return f"{self.method} {self.url}: {self.status} [{self.outcome or 'no X-Crawlergate'}]{where}"


class Person:
    """A browser with a cookie jar; ``via_gate`` adds the X-Crawlergate check to every answer."""

    def __init__(self, base_url: str, *, via_gate: bool, host: str | None = None) -> None:
        headers = dict(CHROME)
        if host:
            headers["host"] = host
        self.base = urlsplit(base_url)
        self.via_gate = via_gate
        self.client = httpx.Client(base_url=base_url, headers=headers, follow_redirects=False, timeout=60)
        self.visits: list[Visit] = []

    def __enter__(self) -> Person:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def history(self) -> str:
        return "\n".join(f"  {visit}" for visit in self.visits)

    def send(self, method: str, url: str, *, expect: int | tuple[int, ...] | None = None, **kwargs) -> httpx.Response:
        response = self.client.request(method, url, **kwargs)
        location = response.headers.get("location", "")
        self.visits.append(
            Visit(
                method,
                str(response.request.url),
                response.status_code,
                response.headers.get("x-crawlergate", ""),
                location,
            )
        )
        if self.via_gate:
            assert response.headers.get("x-crawlergate") == "pass", (
                f"a person's answer must be X-Crawlergate: pass:\n{self.history()}"
            )
        if location:
            target = urlsplit(urljoin(str(response.request.url), location))
            assert (target.scheme, target.netloc) == (self.base.scheme, self.base.netloc), (
                f"Location {location!r} leaves {self.base.scheme}://{self.base.netloc}:\n{self.history()}"
            )
        if expect is not None:
            expected = (expect,) if isinstance(expect, int) else expect
            assert response.status_code in expected, (
                f"{method} {url}: status {response.status_code}, expected {expected}:\n{self.history()}\n"
                f"{response.text[:2000]}"
            )
        return response

    def follow(self, response: httpx.Response, limit: int = 5) -> httpx.Response:
        """Follow redirects by hand (each Location was checked by ``send``)."""
        for _ in range(limit):
            if not response.is_redirect:
                return response
            response = self.send("GET", urljoin(str(response.request.url), response.headers["location"]))
        raise AssertionError(f"more than {limit} redirects:\n{self.history()}")


def hidden_input(html: str, name: str) -> str:
    """The value of ``<input name=NAME ... value=...>`` (attributes in any order)."""
    for tag in re.findall(r"<input\b[^>]*>", html):
        if re.search(rf'\bname="{re.escape(name)}"', tag):
            value = re.search(r'\bvalue="([^"]*)"', tag)
            if value:
                return value.group(1)
    raise AssertionError(f"no hidden input {name!r} in the page:\n{html[:1500]}")


# --- Trac -------------------------------------------------------------------------------------------

TRAC_MEMBER_PAGE = "/wiki/WikiStart"


def trac_logged_in(html: str) -> bool:
    return re.search(rf"logged in as\s*<span[^>]*>\s*{trac_site.USER}\s*<", html) is not None


def trac_person(person: Person) -> None:
    """Log in (HTTP basic auth on /login), create a ticket, attach 5 MB to it, open pages, log out."""
    person.send("GET", "/login", expect=401)
    welcome = person.follow(person.send("GET", "/login", auth=(trac_site.USER, trac_site.PASSWORD), expect=302))
    assert welcome.status_code == 200 and trac_logged_in(welcome.text), person.history()
    assert "trac_auth" in person.client.cookies, "Trac set no trac_auth cookie on /login"

    form = person.send("GET", "/newticket", expect=200)
    created = person.send(
        "POST",
        "/newticket",
        data={
            "__FORM_TOKEN": hidden_input(form.text, "__FORM_TOKEN"),
            "field_summary": "Filed by a person through the gate",
            "field_description": "Steps to reproduce: none.",
            "field_type": "defect",
            "field_reporter": trac_site.USER,
            "submit": "Create ticket",
        },
        expect=303,
    )
    number = re.search(r"/ticket/(\d+)$", created.headers["location"])
    assert number, f"unexpected Location after creating a ticket: {created.headers['location']}"
    ticket = person.follow(created)
    assert "Filed by a person through the gate" in ticket.text and trac_logged_in(ticket.text)

    ticket_id = number.group(1)
    form = person.send("GET", f"/attachment/ticket/{ticket_id}/?action=new", expect=200)
    attached = person.send(
        "POST",
        f"/attachment/ticket/{ticket_id}",
        data={
            "__FORM_TOKEN": hidden_input(form.text, "__FORM_TOKEN"),
            "action": "new",
            "realm": "ticket",
            "id": ticket_id,
            "description": "five megabytes",
        },
        files={"attachment": ("five-mb.bin", b"\x00" * UPLOAD_BYTES, "application/octet-stream")},
        expect=303,
    )
    listing = person.follow(attached)
    assert "five-mb.bin" in listing.text and f"{UPLOAD_BYTES} bytes" in listing.text, listing.text[:3000]

    # The member's view of a page crawlers have cached: never the guest copy, whatever the user agent.
    for headers in (CHROME, GOOGLEBOT):
        page = person.send("GET", TRAC_MEMBER_PAGE, headers=headers, expect=200)
        assert trac_logged_in(page.text), f"{headers['user-agent']}: the member got a page without 'logged in as'"

    out = person.send(
        "POST", "/logout", data={"__FORM_TOKEN": hidden_input(page.text, "__FORM_TOKEN"), "logout": ""}, expect=303
    )
    after = person.follow(out)
    assert after.status_code == 200 and not trac_logged_in(after.text) and 'href="/login"' in after.text


# --- Django -----------------------------------------------------------------------------------------

DJANGO_MEMBER_PAGE = "/me/"
DJANGO_ITEM = "/items/7/"


def django_signed_in(html: str) -> bool:
    return f"Signed in as {django_seed.USER}" in html


def django_person(person: Person) -> None:
    """Log in with the login form, comment on an item, upload 5 MB, open /me/, log out."""
    form = person.send("GET", "/accounts/login/?next=/me/", expect=200)
    logged_in = person.send(
        "POST",
        "/accounts/login/",
        data={
            "csrfmiddlewaretoken": hidden_input(form.text, "csrfmiddlewaretoken"),
            "username": django_seed.USER,
            "password": django_seed.PASSWORD,
            "next": "/me/",
        },
        expect=302,
    )
    me = person.follow(logged_in)
    assert me.status_code == 200 and f"Member {django_seed.USER}" in me.text, person.history()
    assert "sessionid" in person.client.cookies

    item = person.send("GET", DJANGO_ITEM, expect=200)
    assert django_signed_in(item.text)
    commented = person.send(
        "POST",
        DJANGO_ITEM,
        data={"csrfmiddlewaretoken": hidden_input(item.text, "csrfmiddlewaretoken"), "text": "A person's comment."},
        expect=302,
    )
    item = person.follow(commented)
    assert "A person&#x27;s comment." in item.text or "A person's comment." in item.text, item.text[:3000]

    form = person.send("GET", "/upload/", expect=200)
    uploaded = person.send(
        "POST",
        "/upload/",
        data={"csrfmiddlewaretoken": hidden_input(form.text, "csrfmiddlewaretoken")},
        files={"file": ("five-mb.bin", b"\x00" * UPLOAD_BYTES, "application/octet-stream")},
        expect=302,
    )
    me = person.follow(uploaded)
    assert f"five-mb.bin ({UPLOAD_BYTES} bytes)" in me.text, me.text[:3000]

    # The member's own pages: never from the cache, whatever the user agent.
    for headers in (CHROME, GOOGLEBOT):
        me = person.send("GET", DJANGO_MEMBER_PAGE, headers=headers, expect=200)
        assert f"Member {django_seed.USER}" in me.text, f"{headers['user-agent']}: /me/ without the member"
        page = person.send("GET", DJANGO_ITEM, headers=headers, expect=200)
        assert django_signed_in(page.text), f"{headers['user-agent']}: {DJANGO_ITEM} without 'Signed in as'"

    out = person.send(
        "POST",
        "/accounts/logout/",
        data={"csrfmiddlewaretoken": hidden_input(page.text, "csrfmiddlewaretoken")},
        expect=302,
    )
    home = person.follow(out)
    assert home.status_code == 200 and not django_signed_in(home.text) and 'href="/accounts/login/"' in home.text
