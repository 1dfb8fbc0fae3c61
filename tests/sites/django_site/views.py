from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.contrib.flatpages.models import FlatPage
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from tests.sites.django_site.models import Comment, Item, Upload

ITEMS_PER_PAGE = 30


def home(request):
    pages = FlatPage.objects.order_by("url")
    return render(request, "home.html", {"flatpages": pages, "latest": Item.objects.order_by("-id")[:5]})


def item_list(request):
    paginator = Paginator(Item.objects.all(), ITEMS_PER_PAGE)
    page = paginator.get_page(request.GET.get("page"))
    return render(request, "items.html", {"page": page, "paginator": paginator})


@require_http_methods(["GET", "HEAD", "POST"])
def item_detail(request, pk):
    item = get_object_or_404(Item, pk=pk)
    if request.method == "POST":
        text = request.POST.get("text", "").strip()
        if text:
            author = request.user.get_username() if request.user.is_authenticated else "guest"
            Comment.objects.create(item=item, author=author, text=text)
            return redirect(item.get_absolute_url() + "#comments")
    return render(request, "item.html", {"item": item, "comments": item.comments.all()})


@login_required
def me(request):
    uploads = Upload.objects.filter(user=request.user).order_by("id")
    return render(request, "me.html", {"uploads": uploads})


@require_http_methods(["GET", "HEAD", "POST"])
def upload(request):
    if request.method == "POST":
        if not request.user.is_authenticated:
            return redirect("/accounts/login/?next=/upload/")
        received = request.FILES.get("file")
        if received is None:
            return render(request, "upload.html", {"error": "No file."}, status=400)
        size = sum(len(chunk) for chunk in received.chunks())
        Upload.objects.create(user=request.user, name=received.name, size=size)
        return redirect("/me/")
    return render(request, "upload.html", {})


def noindex(request):
    response = render(
        request, "page.html", {"title": "Not for the index", "text": "A page search engines must not index."}
    )
    response["X-Robots-Tag"] = "noindex"
    response["Link"] = f'<{request.build_absolute_uri("/items/")}>; rel="canonical"'
    return response


def nostore(request):
    response = render(request, "page.html", {"title": "Never stored", "text": "A page no cache may keep."})
    response["Cache-Control"] = "no-store"
    return response
