"""rl-core training backend on megatron-core."""
