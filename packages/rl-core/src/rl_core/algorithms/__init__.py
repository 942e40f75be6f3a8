"""The algorithm loops, one file each (GRPO with DAPO options and the policy-loss family, PPO with a critic,
REINFORCE with a leave-one-out baseline and KL to the initial policy, on-policy distillation, SFT, DPO, reward
models): each reads top-down and builds its step from ``rl_core.training``; the core's plugin
registers them like any outside algorithm."""
