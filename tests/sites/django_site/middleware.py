from __future__ import annotations

from django.conf import settings
from django.core.exceptions import DisallowedHost


class PublicHostOnlyMiddleware:
    """400 for any Host but ``settings.PUBLIC_HOST`` (host and port): ALLOWED_HOSTS ignores ports."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        host = request.get_host()  # X-Forwarded-Host first (USE_X_FORWARDED_HOST), checked by ALLOWED_HOSTS
        if host != settings.PUBLIC_HOST:
            raise DisallowedHost(f"Host {host!r} is not this site's public host {settings.PUBLIC_HOST!r}.")
        return self.get_response(request)
