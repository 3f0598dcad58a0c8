"""Names shared by the Alembic environment and the migration runner."""

VERSION_TABLE = "routines_alembic_version"
