"""Fill a migrated database: a member, 120 items, 25 flat pages. ``python -m tests.sites.django_site.seed``."""

from __future__ import annotations

import os
import sys

ITEMS = 120
FLATPAGES = 25
USER = "member"
PASSWORD = "member-secret-pw"


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.sites.django_site.settings")
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.contrib.flatpages.models import FlatPage
    from django.contrib.sites.models import Site

    from tests.sites.django_site.models import Comment, Item

    get_user_model().objects.create_user(USER, password=PASSWORD)
    items = Item.objects.bulk_create(
        Item(title=f"Item {n}", body=f"The description of item number {n}. " * 5) for n in range(1, ITEMS + 1)
    )
    Comment.objects.bulk_create(
        Comment(item=item, author="reader", text=f"An early comment on {item.title}.") for item in items[::4]
    )
    site = Site.objects.get(pk=1)
    for n in range(1, FLATPAGES + 1):
        url = "/about/" if n == 1 else f"/guide-{n:02d}/"
        links = "".join(
            f'<li><a href="/pages/guide-{m:02d}/">Guide {m}</a></li>'
            for m in (n % FLATPAGES + 1, (n * 3) % FLATPAGES + 1)
            if m > 1
        )
        page = FlatPage.objects.create(
            url=url,
            title="About this site" if n == 1 else f"Guide {n}",
            content=f'<p>Flat page {n}. See <a href="/items/{n}/">item {n}</a>.</p><ul>{links}</ul>',
        )
        page.sites.add(site)


if __name__ == "__main__":
    sys.exit(main())
