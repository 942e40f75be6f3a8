"""HTTP reward server and client reward source for rl-core."""
