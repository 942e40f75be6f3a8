"""rl-core rollout engine on vLLM."""
