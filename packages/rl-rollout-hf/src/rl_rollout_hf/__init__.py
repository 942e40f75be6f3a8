"""rl-core rollout engine on Hugging Face generate."""
