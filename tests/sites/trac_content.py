"""Fill a fresh Trac environment with a small project: wiki pages, milestones, tickets, a member.

Run by the test fixtures with the venv's Python, in its own process (Trac is never imported into
the test process): ``python tests/sites/trac_content.py ENV_DIR USER``.

The content is deterministic: 45 wiki pages that link to each other, to tickets, milestones and
reports; 4 milestones; 60 tickets with comments; a front page linking to all of those (so a capped
breadth-first crawl reaches every kind of page). With Trac's own 60-odd wiki pages, the reports,
the roadmap, the timeline and the query pages that is well over 150 crawlable pages.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta

TOPICS = 45
TICKETS = 60
MILESTONES = ("alpha", "beta", "release-1.0", "release-2.0")
COMPONENTS = ("component1", "component2")


def topic(number: int) -> str:
    return f"Topic{number:02d}"


def topic_text(number: int) -> str:
    lines = [
        f"= {topic(number)} =",
        "",
        f"This is topic number {number} of the crawlergate test project.",
        "",
        f" * previous: [wiki:{topic((number - 2) % TOPICS + 1)}]",
        f" * next: [wiki:{topic(number % TOPICS + 1)}]",
        f" * related: [wiki:{topic((number * 7) % TOPICS + 1)}], [wiki:{topic((number * 11) % TOPICS + 1)}]",
        f" * tickets: #{number}, #{(number * 3) % TICKETS + 1}",
        f" * milestone: [milestone:{MILESTONES[number % len(MILESTONES)]}]",
        " * all tickets: [report:1], the [wiki:WikiStart start page]",
        "",
        "== Details ==",
        "",
        "Lorem ipsum dolor sit amet, consectetur adipiscing elit. " * 4,
    ]
    return "\n".join(lines) + "\n"


def main(env_path: str, user: str) -> None:
    from trac.env import Environment
    from trac.ticket.model import Milestone, Ticket
    from trac.wiki.model import WikiPage

    env = Environment(env_path)
    # A 5 MB attachment must be accepted (Trac's default limit is 256 KiB).
    env.config.set("attachment", "max_size", str(16 * 1024 * 1024))
    env.config.set("logging", "log_type", "none")
    env.config.save()

    start = datetime(2024, 1, 1, tzinfo=UTC)
    for index, name in enumerate(MILESTONES):
        milestone = Milestone(env, name) if name in {m.name for m in Milestone.select(env)} else Milestone(env)
        milestone.name = name
        milestone.due = start + timedelta(days=90 * (index + 1))
        milestone.description = f"Milestone {name}: see [wiki:{topic(index + 1)}] and [report:3]."
        if milestone.exists:
            milestone.update()
        else:
            milestone.insert()

    for number in range(1, TICKETS + 1):
        ticket = Ticket(env)
        ticket["summary"] = f"Ticket number {number}: something to do"
        ticket["description"] = (
            f"Described on [wiki:{topic((number - 1) % TOPICS + 1)}]. See also #{number % TICKETS + 1}."
        )
        ticket["reporter"] = "reporter"
        ticket["owner"] = user if number % 3 == 0 else "somebody"
        ticket["status"] = "new"
        ticket["type"] = ("defect", "enhancement", "task")[number % 3]
        ticket["priority"] = ("major", "minor", "critical")[number % 3]
        ticket["component"] = COMPONENTS[number % 2]
        ticket["milestone"] = MILESTONES[number % len(MILESTONES)]
        ticket_id = ticket.insert(when=start + timedelta(hours=number))
        ticket = Ticket(env, ticket_id)
        ticket.save_changes(
            "reporter", f"A first comment on ticket {number}.", when=start + timedelta(hours=number, minutes=5)
        )

    for number in range(1, TOPICS + 1):
        page = WikiPage(env, topic(number))
        page.text = topic_text(number)
        page.save("editor", f"Create {topic(number)}", start + timedelta(minutes=number))

    front = WikiPage(env, "WikiStart")
    front.text = (
        "= Welcome to the crawlergate test project =\n\n"
        + "".join(f" * [wiki:{topic(n)}]\n" for n in range(1, TOPICS + 1))
        + "\n== Tickets ==\n\n"
        + ", ".join(f"#{n}" for n in range(1, TICKETS + 1))
        + "\n\n== Milestones ==\n\n"
        + "".join(f" * [milestone:{name}]\n" for name in MILESTONES)
        + "\nSee the [roadmap:], the [timeline:], [report:1 active tickets] and TitleIndex.\n"
    )
    front.save("editor", "Front page", start + timedelta(days=1))

    env.shutdown()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
