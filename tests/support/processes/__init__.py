"""What tests start as processes: floom servers and nodes, PostgreSQL databases, the S3
server, the compose stack, TCP proxies and network namespaces."""
