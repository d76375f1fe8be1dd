"""The web UI over HTTP and in headless Chromium."""
