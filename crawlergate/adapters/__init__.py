"""The ways of running the gate: ASGI and WSGI middleware, the reverse proxy, the server."""
