"""The LightningModules and what only training needs.

The LightningModules and what only training needs: ``EnvACEModule`` (role-wise GRPO, ``module``), ``SFTModule``
(the warm start, ``sft``), what they share (``base``), the update's settings, micro-batches and statistics
(``update``), the RL update's optimise loop (``optimise``), group advantages (``advantages``), a training step's
metrics and real-call totals (``step_metrics``), the checks before RL starts (``fit_checks``), keeping a vLLM rollout
engine's weights current (``engine_sync``), the memory estimate and freed-memory policy (``memory``), the DataModule
that streams freshly sampled rollouts (``datamodule``), and the policy export at the end of a run (``export``).

May import: envace.evaluation and the packages below it.
"""
