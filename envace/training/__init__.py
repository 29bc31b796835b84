"""The LightningModules and what only training needs.

The LightningModules and what only training needs: ``EnvACEModule`` (role-wise GRPO, ``module``), ``SFTModule``
(the warm start, ``sft``), what they share (``base``), the update's micro-batches and optimise loop (``update``),
group advantages (``advantages``), the memory estimate and freed-memory policy (``memory``), the DataModule that
streams freshly sampled rollouts (``datamodule``), and the policy export at the end of a run (``export``).

May import: envace.evaluation and the packages below it.
"""
