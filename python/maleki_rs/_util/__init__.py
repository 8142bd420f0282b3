"""Private helpers shared by the subsystems: validation, seeds, progress."""
