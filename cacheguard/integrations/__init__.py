"""Integrations with other libraries, each an optional extra.

- :mod:`cacheguard.integrations.prometheus`: counters and histograms for ``prometheus_client``
  (extra ``prometheus``).
- :mod:`cacheguard.integrations.opentelemetry`: a span per call of a guard, with its outcome,
  its load and waits as child spans (extra ``opentelemetry``).
- :mod:`cacheguard.integrations.dogpile`: the ``cacheguard`` backend for dogpile.cache, with a
  mutex on cacheguard's two-tier lock (extra ``dogpile``).
"""
