"""The HTTP edge: what a connection and a request may hold of a node before a route sees
them (connections and their headers, request bodies)."""
