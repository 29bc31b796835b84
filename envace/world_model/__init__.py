"""The policy's world model: how good it is, and keeping it honest.

How good the policy's world model is, and keeping it honest: rehearsal fidelity against recorded responses
(``fidelity``), audits of rehearsed episodes in the real environment (``audit``), the collusion guard (``guard``),
the module's one place for these during training (``quality``), and the alignment rows that ground the rehearse
role on real responses (``alignment``).

May import: envace.rewards, envace.rollout and the packages below them.
"""
