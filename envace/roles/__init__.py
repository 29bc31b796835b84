"""The policy's two roles: what each writes and how a rehearsal is compared.

The policy's two output formats: what the act role writes (tool calls, answers: ``parsing``), what the rehearse role
is prompted with and writes (``rehearse``), and how a rehearsed response compares with the real one (``compare``:
canonical forms, leaf F1, the fidelity scores, written once for every measure).

May import: envace.types, envace.errors, envace.runtime.
"""
