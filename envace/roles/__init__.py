"""The two roles of the policy: acting (tool calls, answers) and rehearsing (playing the environment)."""
