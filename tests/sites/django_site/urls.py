from __future__ import annotations

from django.urls import include, path

from tests.sites.django_site import views

urlpatterns = [
    path("", views.home, name="home"),
    path("items/", views.item_list, name="items"),
    path("items/<int:pk>/", views.item_detail, name="item"),
    path("me/", views.me, name="me"),
    path("upload/", views.upload, name="upload"),
    path("noindex/", views.noindex, name="noindex"),
    path("nostore/", views.nostore, name="nostore"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("pages/", include("django.contrib.flatpages.urls")),
]
