"""A node's operations: backup and restore, retention, /metrics, copying a store to another
database, the cluster's nodes and `floom doctor`'s checks."""
