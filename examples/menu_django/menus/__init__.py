"""The menus app: the ``Menu`` model, its cached reads, JSON views and the demo command."""
