"""The AWS backend: EC2 machines and S3 storage in the user's own account (docs/BACKENDS.md)."""
