from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

ARTICLES = {
    1: ("Why crawlers cost so much", "They fetch every dynamic page, day and night."),
    2: ("Guest pages for crawlers", "A crawler never needs a page made for one person."),
    3: ("Two cache levels", "Memory first, then gzip files on disk."),
}


def home(request: HttpRequest) -> HttpResponse:
    articles = [(n, title) for n, (title, _) in ARTICLES.items()]
    return render(request, "page.html", {"title": "Articles", "articles": articles})


def article(request: HttpRequest, article_id: int) -> HttpResponse:
    if article_id not in ARTICLES:
        raise Http404("No such article.")
    title, text = ARTICLES[article_id]
    return render(request, "page.html", {"title": title, "text": text})
