"""Worlds answer the act role's tool calls.

Worlds answer the act role's tool calls: rehearsed by the policy, executed for real, played by a frozen model,
answered from recorded responses, or a scheduled mix of these (``HybridWorld``); and the simulated users of
user-mode tasks (``users``).

May import: envace.engines and the packages below it.
"""

from envace.worlds.base import ToolReply, ToolRequest, World
from envace.worlds.cache import ResponseCache
from envace.worlds.frozen import FrozenWorld
from envace.worlds.hybrid import CacheWorld, HybridWorld, Mix, MixSchedule
from envace.worlds.real import RealWorld
from envace.worlds.rehearse import RehearseWorld

__all__ = [
    "CacheWorld",
    "FrozenWorld",
    "HybridWorld",
    "Mix",
    "MixSchedule",
    "RealWorld",
    "RehearseWorld",
    "ResponseCache",
    "ToolReply",
    "ToolRequest",
    "World",
]
