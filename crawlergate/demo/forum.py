"""The demo forum: a real dynamic site (Starlette + SQLite) whose pages cost real work.

Forums → threads → pages of posts, member pages, a front page of the most recently active
threads, guest and logged-in views (a ``sessionid`` cookie; logged-in pages show unread
messages and are ``Cache-Control: private``), and replies that change thread pages. Every dynamic
page runs its SQL queries plus a fixed number of hashing rounds calibrated at start to
``work_ms`` (default 20 ms; the paper's forum took 162 ms a page), so generation cost is CPU,
not a sleep. URLs look like the vBulletin forum of the paper: ``/showthread.php?t=12&page=2``.

    app = create_forum(Path("forum.sqlite3"), threads=3000, work_ms=20)
"""

from __future__ import annotations

import contextlib
import email.utils
import hashlib
import hmac
import html
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from crawlergate.demo.seed import post_text, seed_database

THREADS_PER_PAGE = 20
POSTS_PER_PAGE = 10
SESSION_COOKIE = "sessionid"
CSS = "body{font-family:sans-serif;margin:2em}.post{border-top:1px solid #ccc;padding:.5em 0}.who{color:#555}"


def calibrate_work_units(sample_rounds: int = 20_000) -> float:
    """Hashing rounds per millisecond on this machine, measured once (best of three)."""
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        _burn(sample_rounds)
        best = min(best, time.perf_counter() - started)
    return sample_rounds / (best * 1000)


def _burn(rounds: int) -> bytes:
    digest = b"crawlergate"
    for _ in range(rounds):
        digest = hashlib.sha256(digest).digest()
    return digest


class Forum:
    """The forum's data access and page rendering; ``app`` is the Starlette application."""

    def __init__(self, db_path: Path, *, work_ms: float, secret: bytes, rounds_per_ms: float | None = None) -> None:
        self.db_path = db_path
        self.work_ms = work_ms
        self._rounds = int(work_ms * (rounds_per_ms if rounds_per_ms is not None else calibrate_work_units()))
        self._secret = secret
        self._local = threading.local()
        # WAL once, before any request: threads switching the mode at their first query race for the exclusive
        # lock the switch needs, and SQLite refuses the loser at once, busy timeout or not.
        with contextlib.closing(sqlite3.connect(db_path, timeout=10)) as setup:
            setup.execute("PRAGMA journal_mode=WAL")
        self.app = Starlette(
            routes=[
                Route("/", self._page(self.front)),
                Route("/forumdisplay.php", self._page(self.forum)),
                Route("/showthread.php", self._page(self.thread)),
                # The same pages at plain URLs (a query-less URL is what a front server can answer from disk).
                Route("/f/{f:int}", self._page(self.forum)),
                Route("/f/{f:int}/page/{page:int}", self._page(self.forum)),
                Route("/t/{t:int}", self._page(self.thread)),
                Route("/t/{t:int}/page/{page:int}", self._page(self.thread)),
                Route("/member.php", self._page(self.member)),
                Route("/sitemap.xml", self.sitemap),
                Route("/feed.rss", self.feed),
                Route("/login", self.login, methods=["GET", "POST"]),
                Route("/logout", self.logout),
                Route("/newreply.php", self.reply, methods=["POST"]),
                Route("/static/forum.css", lambda request: Response(CSS, media_type="text/css")),
            ]
        )

    @property
    def db(self) -> sqlite3.Connection:
        connection: sqlite3.Connection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = sqlite3.connect(self.db_path, timeout=10)
            self._local.connection = connection
        return connection

    # --- pages ------------------------------------------------------------------------------------

    def front(self, request: Request, member: int | None) -> tuple[str, str]:
        rows = self.db.execute(
            "SELECT t.id, t.title, t.replies, f.id, f.title FROM threads t JOIN forums f ON f.id = t.forum_id "
            "ORDER BY t.last_post_at DESC LIMIT 30"
        ).fetchall()
        forums = self.db.execute("SELECT id, title, description FROM forums ORDER BY id").fetchall()
        items = "".join(
            f'<li><a href="/showthread.php?t={t}">{_e(title)}</a> ({replies} replies) in '
            f'<a href="/forumdisplay.php?f={f}">{_e(forum)}</a></li>'
            for t, title, replies, f, forum in rows
        )
        forum_items = "".join(
            f'<li><a href="/forumdisplay.php?f={f}">{_e(title)}</a> — {_e(text)}</li>' for f, title, text in forums
        )
        return "Forum", f"<h2>Recently active</h2><ul>{items}</ul><h2>Forums</h2><ul>{forum_items}</ul>"

    def forum(self, request: Request, member: int | None) -> tuple[str, str] | None:
        forum_id, page = _int(request, "f"), max(1, _int(request, "page") or 1)
        row = self.db.execute("SELECT title FROM forums WHERE id = ?", (forum_id,)).fetchone()
        if row is None:
            return None
        total = self.db.execute("SELECT COUNT(*) FROM threads WHERE forum_id = ?", (forum_id,)).fetchone()[0]
        threads = self.db.execute(
            "SELECT t.id, t.title, t.replies, m.id, m.name FROM threads t JOIN members m ON m.id = t.author_id "
            "WHERE t.forum_id = ? ORDER BY t.last_post_at DESC LIMIT ? OFFSET ?",
            (forum_id, THREADS_PER_PAGE, (page - 1) * THREADS_PER_PAGE),
        ).fetchall()
        items = "".join(
            f'<li><a href="/showthread.php?t={t}">{_e(title)}</a> by <a href="/member.php?u={m}">{_e(name)}</a>'
            f" ({replies} replies)</li>"
            for t, title, replies, m, name in threads
        )
        pages = _pager(f"/forumdisplay.php?f={forum_id}", page, total, THREADS_PER_PAGE)
        return row[0], f"<h2>{_e(row[0])}</h2><ul>{items}</ul>{pages}"

    def thread(self, request: Request, member: int | None) -> tuple[str, str] | None:
        thread_id, page = _int(request, "t"), max(1, _int(request, "page") or 1)
        row = self.db.execute(
            "SELECT t.title, t.replies, f.id, f.title FROM threads t JOIN forums f ON f.id = t.forum_id WHERE t.id = ?",
            (thread_id,),
        ).fetchone()
        if row is None:
            return None
        title, replies, forum_id, forum_title = row
        posts = self.db.execute(
            "SELECT p.id, p.created, m.id, m.name, m.posts FROM posts p JOIN members m ON m.id = p.author_id "
            "WHERE p.thread_id = ? ORDER BY p.id LIMIT ? OFFSET ?",
            (thread_id, POSTS_PER_PAGE, (page - 1) * POSTS_PER_PAGE),
        ).fetchall()
        if not posts and page > 1:
            return None
        body = "".join(
            f'<div class="post" id="post{p}"><div class="who"><a href="/member.php?u={m}">{_e(name)}</a>'
            f" ({count} posts) {time.strftime('%Y-%m-%d %H:%M', time.gmtime(created))}</div>"
            f"<p>{_e(post_text(p))}</p></div>"
            for p, created, m, name, count in posts
        )
        pages = _pager(f"/showthread.php?t={thread_id}", page, replies + 1, POSTS_PER_PAGE)
        form = (
            f'<form method="post" action="/newreply.php"><input type="hidden" name="t" value="{thread_id}">'
            '<textarea name="message"></textarea><button>Reply</button></form>'
            if member is not None
            else '<p><a href="/login">Log in</a> to reply.</p>'
        )
        crumbs = f'<a href="/">Forum</a> › <a href="/forumdisplay.php?f={forum_id}">{_e(forum_title)}</a>'
        return title, f"<p>{crumbs}</p><h2>{_e(title)}</h2>{body}{pages}{form}"

    def member(self, request: Request, member: int | None) -> tuple[str, str] | None:
        member_id = _int(request, "u")
        row = self.db.execute("SELECT name, joined, posts FROM members WHERE id = ?", (member_id,)).fetchone()
        if row is None:
            return None
        name, joined, count = row
        recent = self.db.execute(
            "SELECT DISTINCT t.id, t.title FROM posts p JOIN threads t ON t.id = p.thread_id "
            "WHERE p.author_id = ? ORDER BY p.id DESC LIMIT 10",
            (member_id,),
        ).fetchall()
        items = "".join(f'<li><a href="/showthread.php?t={t}">{_e(title)}</a></li>' for t, title in recent)
        joined_text = time.strftime("%Y-%m-%d", time.gmtime(joined))
        return name, f"<h2>{_e(name)}</h2><p>Joined {joined_text}, {count} posts.</p><ul>{items}</ul>"

    # --- actions ----------------------------------------------------------------------------------

    def sitemap(self, request: Request) -> Response:
        ids = self.db.execute("SELECT id FROM threads ORDER BY id LIMIT 50000").fetchall()
        base = f"{request.url.scheme}://{request.url.netloc}"
        urls = "".join(f"<url><loc>{base}/showthread.php?t={row[0]}</loc></url>" for row in ids)
        namespace = "http://www.sitemaps.org/schemas/sitemap/0.9"
        xml = f'<?xml version="1.0" encoding="UTF-8"?><urlset xmlns="{namespace}">{urls}</urlset>'
        return Response(xml, media_type="application/xml")

    def feed(self, request: Request) -> Response:
        """The latest threads as RSS 2.0, what feed readers poll."""
        _burn(self._rounds)
        rows = self.db.execute(
            "SELECT id, title, last_post_at FROM threads ORDER BY last_post_at DESC LIMIT 20"
        ).fetchall()
        base = f"{request.url.scheme}://{request.url.netloc}"
        items = "".join(
            f"<item><title>{_e(title)}</title><link>{base}/showthread.php?t={thread}</link>"
            f"<guid>{base}/showthread.php?t={thread}</guid>"
            f"<pubDate>{email.utils.formatdate(last_post, usegmt=True)}</pubDate></item>"
            for thread, title, last_post in rows
        )
        rss = (
            '<?xml version="1.0" encoding="UTF-8"?><rss version="2.0"><channel><title>Forum</title>'
            f"<link>{base}/</link><description>Latest threads</description>{items}</channel></rss>"
        )
        return Response(rss, media_type="application/rss+xml")

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            return HTMLResponse(
                _layout(
                    "Log in",
                    '<form method="post"><input name="member" value="1"><button>Log in</button></form>',
                    None,
                    0,
                )
            )
        form = await _form(request)
        member_id = int(form.get("member", "1")) if form.get("member", "1").isdigit() else 1
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(SESSION_COOKIE, self._session_value(member_id), httponly=True, samesite="lax")
        return response

    async def logout(self, request: Request) -> Response:
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(SESSION_COOKIE)
        return response

    async def reply(self, request: Request) -> Response:
        member = self._member(request)
        if member is None:
            return PlainTextResponse("Log in to reply.", status_code=403)
        form = await _form(request)
        # The thread comes in the form, or in the query string (as replayed from an access log).
        thread_text = form.get("t") or request.query_params.get("t", "0")
        thread_id = int(thread_text) if thread_text.isdigit() else 0
        now = time.time()
        with self.db:
            updated = self.db.execute(
                "UPDATE threads SET replies = replies + 1, last_post_at = ? WHERE id = ?", (now, thread_id)
            ).rowcount
            if not updated:
                return PlainTextResponse("No such thread.", status_code=404)
            self.db.execute(
                "INSERT INTO posts (thread_id, author_id, created) VALUES (?, ?, ?)", (thread_id, member, now)
            )
            replies = self.db.execute("SELECT replies FROM threads WHERE id = ?", (thread_id,)).fetchone()[0]
        last_page = replies // POSTS_PER_PAGE + 1
        return RedirectResponse(f"/showthread.php?t={thread_id}&page={last_page}", status_code=303)

    # --- plumbing ---------------------------------------------------------------------------------

    def _page(self, render: Callable[[Request, int | None], tuple[str, str] | None]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            member = self._member(request)
            _burn(self._rounds)
            rendered = render(request, member)
            if rendered is None:
                return HTMLResponse(_layout("Not found", "<p>No such page.</p>", None, 0), status_code=404)
            title, body = rendered
            unread = 0
            if member is not None:
                row = self.db.execute("SELECT unread FROM messages WHERE member_id = ?", (member,)).fetchone()
                unread = row[0] if row else 0
            headers = {"cache-control": "private, no-store"} if member is not None else {}
            return HTMLResponse(_layout(title, body, member, unread), headers=headers)

        return endpoint

    def _session_value(self, member_id: int) -> str:
        signature = hmac.new(self._secret, str(member_id).encode(), "sha256").hexdigest()[:16]
        return f"{member_id}.{signature}"

    def _member(self, request: Request) -> int | None:
        value = request.cookies.get(SESSION_COOKIE, "")
        member_id, _, _ = value.partition(".")
        if not member_id.isdigit() or not hmac.compare_digest(value, self._session_value(int(member_id))):
            return None
        return int(member_id)


def create_forum(
    db_path: Path, *, threads: int = 3000, seed: int = 2012, work_ms: float = 20.0, rounds_per_ms: float | None = None
) -> Starlette:
    """Seed (or reuse) the database and return the forum's ASGI app."""
    seed_database(db_path, threads=threads, seed=seed)
    forum = Forum(db_path, work_ms=work_ms, secret=f"demo-{seed}".encode(), rounds_per_ms=rounds_per_ms)
    return forum.app


def _layout(title: str, body: str, member: int | None, unread: int) -> str:
    if member is None:
        who = '<a href="/login">Log in</a>'
    else:
        who = (
            f'Logged in as member{member} · <a href="/messages">{unread} unread messages</a> · '
            '<a href="/logout">Log out</a>'
        )
    return (
        f'<!doctype html><html><head><title>{_e(title)}</title><link rel="stylesheet" href="/static/forum.css">'
        '<link rel="alternate" type="application/rss+xml" title="Latest threads" href="/feed.rss">'
        f'</head><body><header><a href="/">Forum</a> · {who}</header>{body}</body></html>'
    )


def _pager(base: str, page: int, total: int, per_page: int) -> str:
    pages = max(1, -(-total // per_page))
    if pages == 1:
        return ""
    links = " ".join(
        f"<b>{number}</b>" if number == page else f'<a href="{base}&amp;page={number}">{number}</a>'
        for number in range(1, pages + 1)
    )
    return f'<p class="pages">Pages: {links}</p>'


async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form body (all the forum posts), without python-multipart."""
    body = await request.body()
    return {name: values[0] for name, values in parse_qs(body.decode("utf-8", "replace")).items()}


def _int(request: Request, name: str) -> int:
    value = str(request.path_params.get(name, "")) or request.query_params.get(name, "")
    return int(value) if value.isdigit() and len(value) < 10 else 0


def _e(text: object) -> str:
    return html.escape(str(text))
