"""Measuring a policy.

Measuring a policy: the evaluator of validation and test splits (``evaluator``: real success, imagined success,
fidelity, private rehearsal, the engine that generates for it) and episode metrics (``metrics``).

May import: envace.benchmarks and the packages below it.
"""
