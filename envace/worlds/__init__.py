"""Worlds answer the act role's tool calls: rehearsed by the policy, executed for real, or played by a frozen model."""

from envace.worlds.base import ToolReply, ToolRequest, World
from envace.worlds.frozen import FrozenWorld
from envace.worlds.real import RealWorld
from envace.worlds.rehearse import RehearseWorld

__all__ = ["FrozenWorld", "RealWorld", "RehearseWorld", "ToolReply", "ToolRequest", "World"]
