"""Rollouts: episodes sampled from the policy.

Rollouts: the multi-turn episode runner (``runner``, its limits and accounting in ``rules``), private rehearsal
before committed turns (``private_rehearsal``, ``rehearsing``), and collation of episodes into training rows
(``collate``).

May import: envace.worlds and the packages below it (not envace.rewards: episodes are scored after they finish).
"""
