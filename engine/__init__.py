"""The engine under test: our own inference-engine implementation of the models.

Never imports `oracle` (two independent routes to one set of numbers).
"""
