"""Benchmark harnesses and their metrics (BFCL, tau^2-Bench, VitaBench, FinMCP-Bench).

Each benchmark's scoring follows its authors' definitions (``docs/benchmarks.md`` names the sources); metrics are
pure functions with hand-computed tests.
"""

from envace.benchmarks.finmcp import FinMCPRecord, FinMCPScores, load_finmcp, score_finmcp, tool_scores
from envace.benchmarks.passk import pass_at_k, pass_hat_k

__all__ = ["FinMCPRecord", "FinMCPScores", "load_finmcp", "pass_at_k", "pass_hat_k", "score_finmcp", "tool_scores"]
