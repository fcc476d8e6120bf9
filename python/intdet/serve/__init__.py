"""intdet serve: the OpenAI-compatible HTTP server (app.py) and its request shapes (protocol.py)."""
