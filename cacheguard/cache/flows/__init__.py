"""The cache's decisions, with no I/O in them.

* ``fill``  -- the fill algorithm and the hit's verdict
* ``read``  -- ``get_or_load``, ``refresh``, ``peek`` as flows
* ``write`` -- ``write``, ``invalidate``, ``invalidate_prefix`` as flows
* ``state`` -- ``GuardState``: the one state the flows run over (a guard holds one)
"""
