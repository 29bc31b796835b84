"""Rollouts: episodes sampled from the policy.

Rollouts: the multi-turn episode runner (``runner``: the turn loop; its settings in ``config``, its user turns in
``user_turns``, its limits and accounting in ``limits`` and ``rules``, one episode's running state in ``state``),
private rehearsal before committed turns (``private_rehearsal``, ``rehearsing``), and collation of episodes into
training rows (``collate``).

May import: envace.worlds and the packages below it (not envace.rewards: episodes are scored after they finish).
"""
