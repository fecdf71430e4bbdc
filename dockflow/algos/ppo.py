"""PPO (Schulman et al., 2017; Ouyang et al., 2022 for LLMs): a critic and GAE.

One iteration:

1. generate: N responses per prompt (N = 1 is classic PPO; more is allowed) into the dock window.
2. infer: the verifier's reward lands on each response's last token, minus ``kl_coef`` x the per-token KL to
   the reference when ``kl_coef > 0`` (``outcome_token_rewards``); the critic worker estimates a value before
   every response token (``workers/critic.py``); the reward worker turns them into GAE advantages and returns
   (``gae``, ``gae_advantages``), whitened over the batch; old and reference log-probs.
3. update: the actor's clipped surrogate on the per-token ratio (``policy_loss``: ``losses.py:
   clipped_surrogate``); the critic's clipped value loss against the returns (``clipped_value_loss``, which the
   critic worker calls).
4. reshard.

The pieces:

- Token rewards (Ouyang et al., 2022, InstructGPT; Stiennon et al., 2020): the scalar outcome reward sits
  on the last real response token, and every real token pays ``kl_coef * kl_t`` to the reference:
  ``r_t = 1[t = last] * r - kl_coef * kl_t``.
- Generalised advantage estimation (Schulman et al., 2016, "High-Dimensional Continuous Control Using
  Generalized Advantage Estimation"): ``delta_t = r_t + gamma * V_{t+1} - V_t`` and
  ``A_t = delta_t + gamma * lam * A_{t+1}``, with ``V`` and ``A`` after the last real token 0; the value
  targets are ``R_t = A_t + V_t``. Advantages are optionally whitened over the real tokens of the batch.
- Clipped value loss (Schulman et al., 2017, PPO; as in OpenAI baselines, verl, OpenRLHF):
  ``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)``, token-level mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from dockflow.algos.base import Algorithm, PolicyGradientSection, policy_gradient_columns
from dockflow.algos.losses import clipped_surrogate
from dockflow.config.algorithm import CriticSection

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDict

    from dockflow.config import Config


class PPOConfig(CriticSection):
    """PPO's critic and GAE (also used by PF-PPO)."""

    key = "algorithm.ppo"
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount over response tokens.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda (bias/variance trade-off).")
    whiten_advantages: bool = Field(True, description="Normalise GAE advantages over the batch's tokens.")


class PPOSection(PolicyGradientSection):
    """PPO: ``kl_coef`` is a per-token reward penalty."""

    name: Literal["ppo"] = "ppo"
    ppo: PPOConfig = Field(default_factory=PPOConfig)


def outcome_token_rewards(
    rewards: torch.Tensor,
    response_mask: torch.Tensor,
    kl: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """``[B]`` outcome rewards -> ``[B, R]`` token rewards: the reward on the last real token, minus
    ``kl_coef * kl`` on every real token (per-token KL reward shaping). Masked positions are 0.

    A response with no real token has nowhere to carry its reward: its row is all 0.
    """
    import torch

    from dockflow.algos.utils import last_token_index

    if rewards.ndim != 1 or response_mask.ndim != 2 or rewards.shape[0] != response_mask.shape[0]:
        raise ValueError(
            f"rewards must be [B] and response_mask [B, R], got {tuple(rewards.shape)} and {tuple(response_mask.shape)}"
        )
    dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    keep = response_mask.bool()
    positions = torch.arange(response_mask.shape[1], device=response_mask.device)
    on_last = positions.unsqueeze(0) == last_token_index(response_mask).unsqueeze(1)
    token_rewards = on_last.to(dtype) * rewards.to(dtype).unsqueeze(1)
    if kl_coef != 0.0:
        if kl is None:
            raise ValueError("kl_coef != 0 needs kl (the per-token KL to the reference, [B, R])")
        if kl.shape != response_mask.shape:
            raise ValueError(f"kl must have the shape of response_mask {tuple(response_mask.shape)}, got {tuple(kl.shape)}")
        token_rewards = token_rewards - kl_coef * torch.where(keep, kl.to(dtype), torch.zeros_like(token_rewards))
    return token_rewards


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the real tokens of ``[B, R]`` responses -> ``(advantages, returns)``, both ``[B, R]``.

    ``V_{t+1}`` is the value at the next real token (0 after the last one), so masked positions, trailing
    padding or holes, are skipped. ``returns = advantages + values`` on real tokens, computed before
    whitening; ``whiten`` then normalises the advantages to mean 0, std 1 over all real tokens of the batch.
    Masked positions are 0 in both outputs. The outputs are targets: no gradient flows through them.
    """
    import torch

    from dockflow.algos.utils import masked_discounted_cumsum, masked_whiten, next_real_index

    with torch.no_grad():
        if not token_rewards.shape == values.shape == response_mask.shape or token_rewards.ndim != 2:
            raise ValueError(
                "token_rewards, values and response_mask must all be [B, R], got "
                f"{tuple(token_rewards.shape)}, {tuple(values.shape)}, {tuple(response_mask.shape)}"
            )
        keep = response_mask.bool()
        values = values.to(token_rewards.dtype)
        padded = torch.cat([torch.where(keep, values, torch.zeros_like(values)), values.new_zeros(values.shape[0], 1)], dim=1)
        next_values = padded.gather(1, next_real_index(response_mask))
        deltas = token_rewards + gamma * next_values - values
        advantages = masked_discounted_cumsum(deltas, response_mask, gamma * lam)
        returns = torch.where(keep, advantages + values, torch.zeros_like(values))
        if whiten:
            advantages = masked_whiten(advantages, response_mask)
        return advantages, returns


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    response_mask: torch.Tensor,
    clip_range: float,
    token_denom: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped value loss on ``[B, R]`` tensors -> ``(loss, clip_fraction)``.

    ``loss`` is the token-level mean of ``0.5 * max((V - R)^2, (V_clip - R)^2)`` with
    ``V_clip = old + clamp(V - old, -clip_range, clip_range)``. ``token_denom`` is the number of response
    tokens in the whole mini-batch when this call sees one micro-batch of it (as in ``clipped_policy_loss``).
    ``clip_fraction`` is the share of this call's real tokens where the clipped term is the larger one
    (those tokens get no gradient).
    """
    import torch

    from dockflow.algos.utils import masked_mean

    mask = response_mask.to(values.dtype)
    clipped_values = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_loss = (values - returns).square()
    clipped_loss = (clipped_values - returns).square()
    loss = masked_mean(0.5 * torch.maximum(unclipped_loss, clipped_loss), mask, token_denom)
    with torch.no_grad():
        clip_fraction = masked_mean((clipped_loss > unclipped_loss).to(values.dtype), mask)
    return loss, clip_fraction


def gae(cfg: Config, data: TensorDict, kl: torch.Tensor | None) -> TensorDict:
    """GAE advantages and returns from outcome rewards (and the per-token KL penalty) and the critic's values.

    A sample with a NaN reward (no reward applies to it) is out of the update: advantage 0, out of the
    whitening, and its returns are the critic's own values, so the critic learns nothing from it either."""
    import torch
    from tensordict import TensorDict

    from dockflow.algos.utils import zero_nan

    ppo, values = cfg.algorithm.ppo, data["values"]
    scored = ~torch.isnan(data["rewards"])
    mask = data["response_mask"] * scored.unsqueeze(1)
    token_rewards = outcome_token_rewards(zero_nan(data["rewards"]), mask, kl, cfg.algorithm.kl_coef)
    adv, ret = gae_advantages(token_rewards, values, mask, ppo.gamma, ppo.lam, whiten=ppo.whiten_advantages)
    ret = torch.where(scored.unsqueeze(1), ret, values.to(ret.dtype) * data["response_mask"])
    return TensorDict({"advantages": adv, "returns": ret}, batch_size=[len(mask)])


class PPO(Algorithm):
    name = "ppo"
    section = PPOSection
    critic = True
    kl = "reward"
    group_advantages = False  # whitening spans the batch

    def critic_section(self, cfg: Config) -> PPOConfig:
        return cfg.algorithm.ppo

    def consumers(self, cfg: Config) -> dict[str, list[str]]:
        """The on-line states with the critic's: its inference (values) and update (against the returns)."""
        return policy_gradient_columns(cfg, self)

    def advantages(self, cfg: Config, data: TensorDict, generator: Any = None) -> tuple[torch.Tensor, TensorDict]:
        import torch

        return torch.arange(len(data)), gae(cfg, data, self.token_kl(cfg, data))

    def policy_loss(self, cfg: Config, logp: torch.Tensor, micro: TensorDict, tokens: float) -> tuple[torch.Tensor, dict[str, float]]:
        """The symmetric clipped surrogate, token-level mean; no KL term (the KL is in the rewards)."""
        return clipped_surrogate(self, cfg, logp, micro, tokens)
