"""Backends: ``local`` (the manifest's pods as processes) and ``kube`` (a real cluster).

See ``base`` for what every backend offers and ``for_run`` in ``orchestrator.services``
for how one is chosen.
"""
