"""Benchmark harnesses and their metrics.

Benchmark harnesses and their metrics (BFCL, tau^2-Bench, VitaBench, FinMCP-Bench), and their parity with the
official runners (``parity``, ``official``). Each benchmark's scoring follows its authors' definitions
(``docs/benchmarks.md`` names the sources); metrics are pure functions with hand-computed tests.

May import: envace.world_model and the packages below it.
"""

from envace.benchmarks.finmcp import FinMCPRecord, FinMCPScores, load_finmcp, score_finmcp, tool_scores
from envace.benchmarks.passk import pass_at_k, pass_hat_k

__all__ = ["FinMCPRecord", "FinMCPScores", "load_finmcp", "pass_at_k", "pass_hat_k", "score_finmcp", "tool_scores"]
