"""Integrations with other libraries, each an optional extra.

- :mod:`cacheguard.integrations.prometheus`: counters and histograms for ``prometheus_client``
  (extra ``prometheus``).
- :mod:`cacheguard.integrations.dogpile`: the ``cacheguard`` backend for dogpile.cache, with a
  mutex on cacheguard's two-tier lock (extra ``dogpile``).
"""
