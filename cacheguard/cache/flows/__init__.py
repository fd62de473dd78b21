"""The cache's decisions, with no I/O in them.

* ``fill``  -- the fill algorithm and the hit's verdict
* ``read``  -- ``get_or_load``, ``refresh``, ``peek`` as flows
* ``write`` -- ``write``, ``invalidate``, ``invalidate_prefix`` as flows
* ``core``  -- ``GuardCore``: the parts and decisions both guards share
"""
