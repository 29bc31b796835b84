"""Process plumbing every command shares.

Process plumbing every command shares: quiet dependency logs (``noise``), progress lines (``progress``), CPU
matmul precision (``cpu_precision``), distributed helpers (``distributed``), crash-safe checkpoint files
(``checkpoint``).

May import: envace.types, envace.errors (and nothing else of envace).
"""
