"""Test rigs of the cacheguard repository, not shipped with cacheguard itself.

* ``deployments`` -- throwaway Redis Cluster and Sentinel sets (``OwnedRedisCluster``,
  ``OwnedSentinelSet``) on free loopback ports
* ``zookeeper``   -- a throwaway ZooKeeper server from Debian's ``zookeeper`` package

A single throwaway Redis (what the demo and your own tests need) is
:mod:`cacheguard.testing`, which ships with cacheguard.
"""
