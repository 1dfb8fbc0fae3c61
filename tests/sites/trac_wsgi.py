"""Trac as a WSGI application, with tracd's HTTP basic authentication on /login.

For gunicorn (``tests.sites.trac_wsgi:application``), alone or inside the gate (``gated_wsgi``).
Environment: ``TRAC_ENV`` (the environment's folder) and ``TRAC_HTPASSWD`` (an htpasswd file).
"""

from __future__ import annotations

import os

from trac.web.auth import BasicAuthentication
from trac.web.main import dispatch_request
from trac.web.standalone import AuthenticationMiddleware, TracEnvironMiddleware

ENV = os.environ["TRAC_ENV"]
REALM = "crawlergate-tests"

application = AuthenticationMiddleware(
    TracEnvironMiddleware(dispatch_request, None, [ENV], True),
    {"*": BasicAuthentication(os.environ["TRAC_HTPASSWD"], REALM)},
    os.path.basename(ENV),
)
