"""Blob storage: the blobs table indexes every blob (rows.py); a blob store (base.py) holds
the bytes, in the database (database.py) or an S3-compatible bucket (s3.py)."""
