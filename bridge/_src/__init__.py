"""Implementation of `bridge`. Nothing here is public API; see `bridge/__init__.py`."""
