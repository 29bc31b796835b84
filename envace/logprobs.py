"""Per-token log-probabilities of a causal LM, the one forward pass every loss term is computed from."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def token_logps(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    temperatures: Tensor | None = None,
    *,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs of each token given its prefix, under the sampling temperature of its row.

    Args:
        model: a causal LM returning ``.logits``.
        input_ids: right-padded rows.  # [N, T]
        attention_mask: 1 on real tokens.  # [N, T]
        temperatures: per-row sampling temperature; logits are divided by it so that the log-probs are those of
            the distribution the tokens were sampled from (0 = greedy is treated as 1).  # [N]
        with_entropy: also return the per-token entropy of that distribution (no gradient).

    Returns:
        ``logps`` with 0 at position 0 and at padding, and the entropy (or None).  # [N, T], [N, T]
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()  # [N, T-1, V]
    if temperatures is not None:
        t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures)).to(logits)
        logits = logits / t[:, None, None]
    targets = input_ids[:, 1:]  # [N, T-1]
    lse = torch.logsumexp(logits, dim=-1)  # [N, T-1]
    picked = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # [N, T-1]
    valid = attention_mask[:, 1:].to(logits.dtype)
    logps = nn.functional.pad((picked - lse) * valid, (1, 0))  # [N, T]
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)  # [N, T-1, V]
            ent = lse - (probs * logits).sum(-1)  # [N, T-1]
            entropy = nn.functional.pad(ent * valid, (1, 0))
    return logps, entropy
