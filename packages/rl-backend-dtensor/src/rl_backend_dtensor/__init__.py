"""rl-core training backend on PyTorch FSDP2 (DTensor)."""
