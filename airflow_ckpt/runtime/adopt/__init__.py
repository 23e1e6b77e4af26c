"""Adopt a plain Spark checkpoint as a savepoint, and export one back (issue 29)."""
