"""A Django project written for the tests: the usual contrib apps and a small site of items.

Settings come from the environment (see settings.py). Run ``migrate --run-syncdb`` and ``seed`` once,
then serve ``tests.sites.django_site.wsgi:application`` with gunicorn.
"""
