"""Real applications we did not write (Trac, a Django project), run behind the gate by tests/test_real_sites.py.

- ``processes``: start a server as a subprocess on a free loopback port, wait until it answers, stop it.
- ``crawl``: a Googlebot-like breadth-first crawler and the page normalisation for comparisons.
- ``trac_site``, ``trac_content``, ``trac_wsgi``: a Trac environment with content and a member, served
  by ``tracd`` or as a WSGI app.
- ``django_site``: a Django project (sessions, CSRF, flatpages, items with comment forms, login).
- ``gated_wsgi``: any of those WSGI apps inside ``CrawlerGateWSGI``, for gunicorn.
- ``people``: what a person does on each site (log in, post, upload, log out), with the checks.
"""
