"""intdet serve: the OpenAI-compatible HTTP server (app.py builds it and lists the
modules of its endpoints) and its request shapes (protocol.py)."""
