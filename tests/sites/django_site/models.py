from __future__ import annotations

from django.conf import settings
from django.db import models


class Item(models.Model):
    title = models.CharField(max_length=200)
    body = models.TextField()

    class Meta:
        ordering = ["id"]

    def get_absolute_url(self) -> str:
        return f"/items/{self.pk}/"


class Comment(models.Model):
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="comments")
    author = models.CharField(max_length=100)
    text = models.TextField()
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]


class Upload(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE)
    name = models.CharField(max_length=200)
    size = models.BigIntegerField()
