"""The native /api/v2 routes, the dashboard, health, metrics and blobs, each
a handler from a request to an answer (hordelite.http).

The route table (``hordelite.http.routes``) lists them beside the OpenAI
front (``hordelite.front``), above both.
"""
