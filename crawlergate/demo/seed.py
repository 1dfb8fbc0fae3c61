"""The demo forum's SQLite database: schema and deterministic seeding.

Forums hold threads, threads hold posts, members write them. The same (threads, seed) always gives
the same database, so traces generated for it stay valid. Post bodies are not stored: they are
derived from the post id when a page is rendered, which keeps a paper-scale database (153,100
threads, about 1.2 million posts) to a few hundred megabytes.

    seed_database(Path("forum.sqlite3"), threads=3000, seed=2012)
"""

from __future__ import annotations

import contextlib
import random
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from crawlergate.errors import ConfigError

SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE forums (id INTEGER PRIMARY KEY, title TEXT NOT NULL, description TEXT NOT NULL);
CREATE TABLE members (id INTEGER PRIMARY KEY, name TEXT NOT NULL, joined REAL NOT NULL, posts INTEGER NOT NULL);
CREATE TABLE threads (
    id INTEGER PRIMARY KEY, forum_id INTEGER NOT NULL, title TEXT NOT NULL, author_id INTEGER NOT NULL,
    created REAL NOT NULL, last_post_at REAL NOT NULL, replies INTEGER NOT NULL
);
CREATE TABLE posts (
    id INTEGER PRIMARY KEY, thread_id INTEGER NOT NULL, author_id INTEGER NOT NULL, created REAL NOT NULL
);
CREATE TABLE messages (member_id INTEGER PRIMARY KEY, unread INTEGER NOT NULL);
CREATE INDEX threads_by_forum ON threads (forum_id, last_post_at DESC);
CREATE INDEX threads_by_activity ON threads (last_post_at DESC);
CREATE INDEX posts_by_thread ON posts (thread_id, id);
"""

TOPICS = (
    "engine", "gearbox", "brakes", "tyres", "paint", "wiring", "exhaust", "suspension", "turbo", "clutch",
    "radiator", "battery", "headlights", "alarm", "seats", "stereo", "wheels", "diesel", "servicing", "insurance",
)  # fmt: skip
WORDS = (
    "noise", "when", "cold", "start", "replaced", "the", "part", "still", "same", "problem", "dealer", "says",
    "normal", "any", "ideas", "thanks", "mine", "did", "this", "too", "after", "miles", "check", "sensor",
    "cheap", "fix", "worked", "for", "me", "photo", "attached", "cost", "quote", "garage", "weekend", "job",
)  # fmt: skip
EPOCH = 1_300_000_000.0  # March 2011, the paper's trace
POSTS_PER_THREAD_MAX = 60


@dataclass(frozen=True, slots=True)
class ForumShape:
    """How big the seeded forum is."""

    threads: int
    forums: int
    members: int
    posts: int


def forum_count(threads: int) -> int:
    return max(4, min(200, threads // 400))


def member_count(threads: int) -> int:
    return max(50, threads // 3)


def seed_database(path: Path, *, threads: int, seed: int) -> ForumShape:
    """Create (or reuse, when it was seeded with the same parameters) the forum database at ``path``."""
    wanted = f"{threads}:{seed}"
    if path.exists():
        # Only a demo forum's own database is reseeded: whatever else is at the path is somebody's, left alone.
        try:
            with contextlib.closing(sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)) as connection:
                row = connection.execute("SELECT value FROM meta WHERE key = 'shape'").fetchone()
                if row is not None and row[0] == wanted:
                    return shape_of(connection)
        except sqlite3.DatabaseError:
            row = None
        if row is None:
            raise ConfigError(f"'{path}' is not a demo forum's database; give --db a new file (or one the demo made).")
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    forums, members = forum_count(threads), member_count(threads)
    connection = sqlite3.connect(path)
    try:
        connection.executescript(SCHEMA)
        connection.executemany(
            "INSERT INTO forums VALUES (?, ?, ?)",
            ((f, f"{_topic(f).title()} talk {f}", f"All about {_topic(f)}") for f in range(1, forums + 1)),
        )
        joined = [EPOCH - rng.random() * 3e8 for _ in range(members)]
        post_counts = [0] * (members + 1)
        post_id = 0
        thread_rows, post_rows = [], []
        for thread_id in range(1, threads + 1):
            # Replies follow a heavy tail: most threads are short, a few run to many pages.
            replies = min(POSTS_PER_THREAD_MAX - 1, int(rng.paretovariate(1.3)) - 1 + rng.randrange(4))
            created = EPOCH - rng.random() * 2e8
            author = rng.randrange(1, members + 1)
            last = created
            for number in range(replies + 1):
                post_id += 1
                last = created + number * rng.random() * 86400
                writer = author if number == 0 else rng.randrange(1, members + 1)
                post_counts[writer] += 1
                post_rows.append((post_id, thread_id, writer, last))
            title = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 8))).capitalize()
            thread_rows.append((thread_id, rng.randrange(1, forums + 1), title, author, created, last, replies))
            if len(post_rows) > 50_000:
                connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?)", post_rows)
                post_rows.clear()
        connection.executemany("INSERT INTO posts VALUES (?, ?, ?, ?)", post_rows)
        connection.executemany("INSERT INTO threads VALUES (?, ?, ?, ?, ?, ?, ?)", thread_rows)
        connection.executemany(
            "INSERT INTO members VALUES (?, ?, ?, ?)",
            ((m, f"member{m}", joined[m - 1], post_counts[m]) for m in range(1, members + 1)),
        )
        connection.executemany(
            "INSERT INTO messages VALUES (?, ?)", ((m, rng.randrange(0, 5)) for m in range(1, members + 1))
        )
        connection.execute("INSERT INTO meta VALUES ('shape', ?)", (wanted,))
        connection.commit()
        return shape_of(connection)
    finally:
        connection.close()


def shape_of(connection: sqlite3.Connection) -> ForumShape:
    def count(table: str) -> int:
        return int(connection.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])

    return ForumShape(threads=count("threads"), forums=count("forums"), members=count("members"), posts=count("posts"))


def _topic(number: int) -> str:
    return TOPICS[number % len(TOPICS)]


def post_text(post_id: int, words: int = 160) -> str:
    """The body of a post, derived from its id (the same every time)."""
    rng = random.Random(post_id)
    sentences = []
    while words > 0:
        length = rng.randrange(6, 18)
        sentences.append(" ".join(rng.choice(WORDS) for _ in range(length)).capitalize() + ".")
        words -= length
    return " ".join(sentences)
