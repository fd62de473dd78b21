"""A small Django version of the menu service: cacheguard's Django cache backend in
``CACHES``, ``track_models`` wired in the app's ``AppConfig.ready()``, reads through
``@cached_with_lock``, JSON views, and the ``menu_demo`` command (stampede and stale
read, against Django's own Redis backend). See README.md."""
