"""The ways of running the gate: ASGI and WSGI middleware that drive the flow, the in-app origins, the reverse
proxy and its origin transport, the server."""
