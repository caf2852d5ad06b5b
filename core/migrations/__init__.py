"""Alembic migrations of the database schema (SQLite and PostgreSQL); `core.schema` runs them."""
