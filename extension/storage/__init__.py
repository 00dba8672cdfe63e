"""Per-user storage quotas held by the kernel, GPFS style (docs/security.md "Storage quotas")."""
