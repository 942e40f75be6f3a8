"""reasoning-gym's procedural tasks and scorers for rl-core."""
