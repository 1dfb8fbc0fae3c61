"""A minimal Django project with crawlergate applied in wsgi.py and asgi.py.

export DJANGO_SETTINGS_MODULE=examples.django_site.settings DJANGO_DB_PATH=/tmp/example.sqlite3
python -m django migrate && python -m django createsuperuser
gunicorn examples.django_site.wsgi          # or: uvicorn examples.django_site.asgi:application
"""
