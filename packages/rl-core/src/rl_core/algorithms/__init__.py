"""The algorithm loops, one file each (GRPO with DAPO options, REINFORCE with a leave-one-out baseline and KL to the
initial policy, SFT, DPO): each reads top-down and builds its step from ``rl_core.training``; the core's plugin
registers them like any outside algorithm."""
