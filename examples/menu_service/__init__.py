"""A menu service cached with cacheguard: a menu table, a cached repository,
SQLAlchemy hooks on the write path, a stampede demo and a small HTTP API."""
