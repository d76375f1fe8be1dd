"""Workers: deploying versions and rolling back (versions.py), deleting, diffs between versions,
the shipped examples, which surfaces may start a worker, and a node's ceilings on worker.yml's
limits."""
