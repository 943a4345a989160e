"""The OpenAI-compatible front: /v1 routes in the same app and process."""
