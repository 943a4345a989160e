"""The native /api/v2 routes, the dashboard, health, metrics and blobs.

The app that serves them beside the OpenAI front (``hordelite.front``) is
assembled in ``hordelite.app``, above both.
"""
