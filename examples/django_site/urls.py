from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from examples.django_site import views

urlpatterns = [
    path("", views.home, name="home"),
    path("articles/<int:article_id>", views.article, name="article"),
    path(
        "login",
        auth_views.LoginView.as_view(template_name="login.html", extra_context={"title": "Log in"}),
        name="login",
    ),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
]
