"""The cache's decisions, with no I/O in them.

* ``fill``  -- the fill algorithm: one load of a missing key across processes
* ``read``  -- ``get_or_load``, ``refresh``, ``peek`` as flows, and a hit's verdict
* ``write`` -- ``write``, ``invalidate``, ``invalidate_prefix`` as flows
* ``state`` -- ``GuardState``: the one state the flows run over (a guard holds one)
"""
