"""The algorithm loops, one file each."""
