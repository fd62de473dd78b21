"""The menu service of the source documents: a menu table, a cached repository,
SQLAlchemy hooks on the write path, a stampede demo and a small HTTP API."""
